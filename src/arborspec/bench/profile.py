"""Where the time goes, for whoever changes the engine: a target forward by operator, and a
speculative step by phase (`arborspec dev profile forward|steps`, on the CPU).

**forward** (`profile_forwards`): for each precision and each row count n, a forward of n rows (a
star tree: root + n - 1 children) over a cache of random tokens, as a step runs it:
`ModelAdapter.tree_forward` (mask and positions built, the decoder, the cache written), then the
greedy token of one row through the LM head (`engine/lm_head.py`).

* `wall_ms`: median of the timed forwards, nothing else measured (the precisions take turns);
* `ops_ms`: `torch.profiler` self CPU time per operator group, per forward (its own rounds): the
  linears (fbgemm int8 or MKL float32), attention, activation quantisation (int8: the per-row scale
  and the division before the kernel, the rescale after), cache writes and dtype conversions, the
  other elementwise operators (norms, rotary embedding, SiLU, residual adds), masks and positions,
  the rest;
* `python_and_dispatch_ms`: the wall time not spent inside any operator: Python (transformers'
  modules, arborspec's adapter), module calls and operator dispatch;
* `modules_ms`: wall time inside each kind of decoder submodule (forward hooks, summed over the
  layers): self-attention with its projections, the MLP, the two norms; `outside_layers_ms` the
  rest of the forward (embedding, rotary table, final norm, adapter, LM head).

The profiler and the hooks add overhead of their own: `wall_ms` is taken without either, and the
groups are read as shares, not as a sum equal to `wall_ms`. The forwards run eagerly unless
`traced` (then an int8 target's forwards are replayed from traces, engine/traced.py, and the
submodule hooks see nothing).

**steps** (`split_steps`): plain decoding and each method take turns prompt by prompt over the
stratified MT-Bench first turns (after one warm-up generation each); their milliseconds per token
give the speedup as `arborspec bench` computes it. Each step is split by timing the engine's own
calls (wrappers, a few microseconds per call): the target's tree forward
(`ModelAdapter.tree_forward`, a replay inside it where the target replays), `feed` (the prompt's
prefill; plain decoding's one-token forwards), the greedy screens of the rows the verifier reads
(`GreedyScreen.argmax_rows`; when sampling, `logits`: full LM-head rows), the drafter's `begin` and
`expand`, the cache compaction, and the rest of the step (building the tree, the verifier's walk,
statistics). `trace_seconds`: what making each trace of engine/traced.py cost (once per kind of
forward, during the warm-up).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from ..common.chat import encode_messages, eos_ids
from ..engine.adapter import ModelAdapter
from ..engine.cost import random_context
from ..engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from ..engine.lm_head import GreedyScreen, HeadRows
from ..engine.sampling import SamplingConfig
from ..engine.traced import TracedDecoder
from ..engine.tree import TokenTree
from ..errors import ArborError
from ..models import load_model, load_pair
from .prompts import conversation, load_prompts
from .run import expand_methods

Report = Callable[[dict], None]

# ---------------------------------------------------------------------------------------- forward
# operator -> group: fbgemm int8 and attention kernels by name prefix, the rest by exact name
PREFIXES = (
    ("quantized::", "linears"),
    ("aten::_scaled_dot_product", "attention"),
    ("aten::scaled_dot_product", "attention"),
)
QUANTISATION = "activation quantisation"
CACHE = "cache writes and conversions"
MASKS = "masks and positions"
ELEMENTWISE = "norms, rotary, activation, residual"
GROUPS = {
    "aten::addmm": "linears",
    "aten::mm": "linears",
    "aten::linear": "linears",
    "aten::matmul": "linears",
    "aten::_softmax": "attention",
    **dict.fromkeys(
        ("aten::amax", "aten::abs", "aten::clamp_min", "aten::clamp_min_", "aten::div",
         "aten::div_", "aten::mul_"),
        QUANTISATION,
    ),
    **dict.fromkeys(("aten::copy_", "aten::_to_copy", "aten::to", "aten::index_select"), CACHE),
    **dict.fromkeys(
        ("aten::arange", "aten::ones", "aten::full", "aten::masked_fill", "aten::where"), MASKS
    ),
    **dict.fromkeys(
        ("aten::mul", "aten::add", "aten::add_", "aten::pow", "aten::mean", "aten::rsqrt",
         "aten::silu", "aten::neg", "aten::cat", "aten::cos", "aten::sin"),
        ELEMENTWISE,
    ),
}
SUBMODULES = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")


@dataclass(frozen=True)
class ForwardProfileConfig:
    target: str = "embedded"
    dtypes: tuple[str, ...] = ("float32", "int8")
    sizes: tuple[int, ...] = (1, 4, 16)
    context: int = 200
    repeats: int = 21
    rounds: int = 10
    traced: bool = False

    def validate(self) -> None:
        if not self.dtypes or not self.sizes:
            raise ArborError("give at least one precision (--dtype) and one row count (--sizes)")
        if min(self.sizes) < 1 or self.context < 1 or self.repeats < 1 or self.rounds < 1:
            raise ArborError("--sizes, --context, --repeats and --rounds must be >= 1")


def star(context: list[int], n: int) -> TokenTree:
    """The root (the context's last token) and n - 1 children."""
    tree = TokenTree.from_root(context[-1])
    for j in range(n - 1):
        tree.add(0, context[j] + 1)
    return tree


def group_of(name: str) -> str:
    prefixed = next((g for prefix, g in PREFIXES if name.startswith(prefix)), None)
    return prefixed or GROUPS.get(name, "other operators")


def _one_forward(adapter: ModelAdapter, context: list[int], tree: TokenTree) -> None:
    adapter.crop_to(len(context))
    adapter.tree_forward(tree, lazy=True).argmax(0)  # the greedy token of one row


def _wall_ms(adapter: ModelAdapter, context: list[int], tree: TokenTree, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _one_forward(adapter, context, tree)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def operator_groups(adapter, context, tree, rounds: int) -> dict[str, float]:
    """Self CPU ms per operator group per forward, largest first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(rounds):
            _one_forward(adapter, context, tree)
    groups: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        groups[group_of(event.key)] += event.self_cpu_time_total / 1e3 / rounds
    return dict(sorted(groups.items(), key=lambda kv: -kv[1]))


def module_times(adapter, context, tree, rounds: int) -> dict[str, float]:
    """Wall ms inside each kind of decoder submodule per forward (hooks), and outside the layers."""
    spent: dict[str, float] = defaultdict(float)
    started: dict[int, float] = {}
    hooks = []

    def before(module, args):
        started[id(module)] = time.perf_counter()

    def after(kind):
        def hook(module, args, output):
            spent[kind] += time.perf_counter() - started.pop(id(module))

        return hook

    for layer in adapter.model.get_decoder().layers:
        for kind in SUBMODULES:
            module = getattr(layer, kind, None)
            if module is not None:
                hooks.append(module.register_forward_pre_hook(before))
                hooks.append(module.register_forward_hook(after(kind)))
    try:
        t0 = time.perf_counter()
        for _ in range(rounds):
            _one_forward(adapter, context, tree)
        total = time.perf_counter() - t0
    finally:
        for h in hooks:
            h.remove()
    out = {k: round(v / rounds * 1e3, 3) for k, v in spent.items()}
    out["outside_layers_ms"] = round((total - sum(spent.values())) / rounds * 1e3, 3)
    return out


def profile_forwards(cfg: ForwardProfileConfig, report: Report | None = None) -> dict:
    """Every precision's forward of every size, profiled (module doc); `report` gets each row."""
    cfg.validate()
    paths = {
        dtype: ModelAdapter(load_model(cfg.target, "cpu", dtype), trace=cfg.traced)
        for dtype in dict.fromkeys(cfg.dtypes)
    }
    first = next(iter(paths.values()))
    context = random_context(first.vocab_size, cfg.context, seed=0)
    results = []
    with torch.inference_mode():
        for adapter in paths.values():  # the cache filled once; each forward crops back to it
            adapter.reset()
            adapter.prefill(torch.tensor(context))
            for _ in range(3):
                _one_forward(adapter, context, star(context, 4))
        for n in cfg.sizes:
            tree = star(context, n)
            # interleaved: each precision's wall time taken between the others'
            walls: dict[str, list[float]] = {name: [] for name in paths}
            for _ in range(3):
                for name, adapter in paths.items():
                    walls[name].append(_wall_ms(adapter, context, tree, cfg.repeats // 3 or 1))
            for name, adapter in paths.items():
                ops = operator_groups(adapter, context, tree, cfg.rounds)
                row = {
                    "path": name,
                    "rows": n,
                    "wall_ms": round(statistics.median(walls[name]), 3),
                    "ops_ms": {k: round(v, 3) for k, v in ops.items()},
                    "ops_total_ms": round(sum(ops.values()), 3),
                    "modules_ms": module_times(adapter, context, tree, cfg.rounds),
                }
                row["python_and_dispatch_ms"] = round(row["wall_ms"] - row["ops_total_ms"], 3)
                results.append(row)
                if report is not None:
                    report(row)
    return {
        "what": "a tree forward of n rows over a cache of random tokens, one greedy token",
        "target": cfg.target,
        "context": cfg.context,
        "traced": cfg.traced,
        "threads": torch.get_num_threads(),
        "results": results,
    }


# ------------------------------------------------------------------------------------------ steps
PHASES = (
    ("target_forward", ModelAdapter, "tree_forward"),
    ("feed", ModelAdapter, "feed"),
    ("screen", GreedyScreen, "argmax_rows"),
    ("compaction", ModelAdapter, "compact"),
    ("logits", HeadRows, "logits"),
)
DRAFT_PHASES = (("draft_begin", "begin"), ("draft_expand", "expand"))


@dataclass(frozen=True)
class StepSplitConfig:
    target: str = "embedded"
    draft: str | None = None
    dtype: str = "int8"
    draft_logits: str = "auto"
    methods: tuple[str, ...] = ("dyspec:budget=1:lookup=6",)
    prompts: str = "mt-bench"
    num_prompts: int = 8
    max_new_tokens: int = 128
    temperature: float = 0.0

    def validate(self) -> None:
        if self.num_prompts < 1 or self.max_new_tokens < 1:
            raise ArborError("--num-prompts and --max-new-tokens must be >= 1")
        if not self.methods:
            raise ArborError("give at least one method (-m NAME:KEY=V...)")
        SamplingConfig(temperature=self.temperature)  # a bad temperature fails in one line


class PhaseTimers:
    """Seconds spent inside wrapped methods, by phase, while `active`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.active = False

    def timed(self, phase: str, inner: Callable) -> Callable:
        timers = self

        def wrapper(*args, **kwargs):
            if not timers.active:
                return inner(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                timers.seconds[phase] += time.perf_counter() - t0
                timers.calls[phase] += 1

        return wrapper

    @contextlib.contextmanager
    def wrapping(self, targets: list[tuple[str, type, str]]) -> Iterator[None]:
        """Wrap each (phase, class, method) while inside; the classes are restored after."""
        saved = [(cls, name, cls.__dict__.get(name)) for _, cls, name in targets]
        try:
            for phase, cls, name in targets:
                setattr(cls, name, self.timed(phase, getattr(cls, name)))
            yield
        finally:
            for cls, name, own in saved:
                if own is None:  # inherited: the base class's method again
                    delattr(cls, name)
                else:
                    setattr(cls, name, own)


@contextlib.contextmanager
def timed_traces(seconds: list[float]) -> Iterator[None]:
    """Append the seconds each trace of engine/traced.py takes to make, while inside."""
    make = TracedDecoder.__dict__["_trace"]

    def timed(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return make(self, *args, **kwargs)
        finally:
            seconds.append(round(time.perf_counter() - t0, 3))

    TracedDecoder._trace = timed
    try:
        yield
    finally:
        TracedDecoder._trace = make


def split_steps(cfg: StepSplitConfig, report: Report | None = None) -> dict:
    """Plain decoding and each method split by phase (module doc); `report` gets each row."""
    cfg.validate()
    methods = expand_methods(list(cfg.methods))  # a bad spec fails before any model loads
    pair = load_pair(cfg.target, cfg.draft, "cpu", cfg.dtype, draft_logits=cfg.draft_logits)
    prompts = [
        encode_messages(pair.tokenizer, conversation(p, []), True)
        for p in load_prompts(cfg.prompts, cfg.num_prompts)
    ]
    dcfg = DecodeConfig(
        max_new_tokens=cfg.max_new_tokens,
        sampling=SamplingConfig(temperature=cfg.temperature),
        eos_token_ids=tuple(eos_ids(pair.tokenizer, pair.target.model)),
    )
    runners: dict[str, Callable[[list[int]], object]] = {
        "plain": lambda ids: autoregressive_generate(pair.target, ids, dcfg)
    }
    for m in methods:
        decoder = SpeculativeDecoder(pair.target, pair.drafter, m.make(), lookup=m.lookup)
        runners[m.label] = lambda ids, decoder=decoder: decoder.generate(ids, dcfg)
    timers = PhaseTimers()
    drafter_cls = type(pair.drafter)
    wrapped = list(PHASES) + [(phase, drafter_cls, name) for phase, name in DRAFT_PHASES]
    trace_seconds: list[float] = []
    totals = {label: defaultdict(float) for label in runners}
    with timers.wrapping(wrapped), timed_traces(trace_seconds), torch.inference_mode():
        for run in runners.values():
            run(prompts[0])
        for ids in prompts:
            for label, run in runners.items():
                timers.seconds.clear()
                timers.calls.clear()
                timers.active = True
                t0 = time.perf_counter()
                result = run(ids)
                wall = time.perf_counter() - t0
                timers.active = False
                t = totals[label]
                t["seconds"] += wall
                t["tokens"] += len(result.output_ids)
                t["steps"] += len(result.steps) or len(result.output_ids)
                for phase, seconds in timers.seconds.items():
                    t[phase] += seconds
                    t[phase + "_calls"] += timers.calls[phase]
    names = [p for p, _, _ in PHASES] + [p for p, _ in DRAFT_PHASES]
    plain_ms = 1e3 * totals["plain"]["seconds"] / max(totals["plain"]["tokens"], 1)
    rows = []
    for label, t in totals.items():
        steps = max(t["steps"], 1)
        phases = {p: round(1e3 * t[p] / steps, 3) for p in names if t[p]}
        step_ms = 1e3 * t["seconds"] / steps
        phases["rest"] = round(step_ms - sum(phases.values()), 3)
        ms_per_token = 1e3 * t["seconds"] / max(t["tokens"], 1)
        rows.append(
            {
                "method": label,
                "ms_per_token": round(ms_per_token, 3),
                "speedup": round(plain_ms / ms_per_token, 3),
                "tokens_per_step": round(t["tokens"] / steps, 3),
                "ms_per_step": round(step_ms, 3),
                "phase_ms_per_step": phases,
                "calls_per_step": {
                    p: round(t[p + "_calls"] / steps, 2) for p in phases if p != "rest"
                },
            }
        )
        if report is not None:
            report(rows[-1])
    return {
        "what": "a speculative step split by the engine's calls, against a plain token",
        "target": pair.target_name,
        "draft": pair.draft_name,
        "dtype": pair.precision,
        "prompts": cfg.prompts,
        "num_prompts": len(prompts),
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "threads": torch.get_num_threads(),
        "rows": rows,
        "trace_seconds": trace_seconds,
    }
