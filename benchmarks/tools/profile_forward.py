"""Where one forward's time goes, float32 against int8, by row count (docs/evaluation.md (h)).

    .venv/bin/python benchmarks/tools/profile_forward.py \
        --out benchmarks/results/forward-profile.json

For each path (the unmodified float32 target, the batch-invariant int8 target) and each row count n,
a forward of n rows (a star tree: root + n - 1 children) over a cache of 200 random tokens, as a
step runs it: `ModelAdapter.tree_forward` (mask and positions built, the decoder, the cache
written), then the greedy token of one row through the screened LM head (`engine/lm_head.py`: plain
greedy decoding's read, a verifier's first).

* `wall_ms`: median of `--repeats` timed forwards, nothing else measured;
* `ops`: `torch.profiler` self CPU time per operator group, per forward (its own rounds): the
  linears (fbgemm int8 or MKL float32), attention, activation quantisation (int8: the per-row scale
  and the division before the kernel, the rescale after), the float64 cache writes and dtype
  conversions, the other elementwise ops (norms, rotary embedding, SiLU, residual adds), mask and
  position construction, the LM head, the rest;
* `python_and_dispatch_ms`: the wall time not spent inside any operator: Python (transformers'
  modules, arborspec's adapter), module calls and operator dispatch;
* `modules_ms`: wall time inside each kind of decoder submodule (forward hooks, summed over the 30
  layers): self-attention with its projections, the MLP, the two norms; `outside_layers_ms` the
  rest of the forward (embedding, rotary table, final norm, adapter, LM head).

The profiler and the hooks each add overhead of their own: `wall_ms` is taken without either, and
the groups are read as shares, not as a sum equal to `wall_ms`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from arborspec.common.jsonfiles import write_json_atomic
from arborspec.common.provenance import machine_info, utc_timestamp, versions
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.cost import random_context
from arborspec.engine.tree import TokenTree
from arborspec.models import load_model

# operator -> group: fbgemm int8 and attention kernels by name prefix, the rest by exact name
PREFIXES = (
    ("quantized::", "linears"),
    ("aten::_scaled_dot_product", "attention"),
    ("aten::scaled_dot_product", "attention"),
)
GROUPS = {
    "aten::addmm": "linears",
    "aten::mm": "linears",
    "aten::linear": "linears",
    "aten::matmul": "linears",
    "aten::_softmax": "attention",
    "aten::amax": "activation quantisation",
    "aten::abs": "activation quantisation",
    "aten::clamp_min": "activation quantisation",
    "aten::clamp_min_": "activation quantisation",
    "aten::div": "activation quantisation",
    "aten::div_": "activation quantisation",
    "aten::mul_": "activation quantisation",
    "aten::copy_": "cache writes and conversions",
    "aten::_to_copy": "cache writes and conversions",
    "aten::to": "cache writes and conversions",
    "aten::index_select": "cache writes and conversions",
    "aten::arange": "masks and positions",
    "aten::ones": "masks and positions",
    "aten::full": "masks and positions",
    "aten::masked_fill": "masks and positions",
    "aten::where": "masks and positions",
    "aten::mul": "norms, rotary, activation, residual",
    "aten::add": "norms, rotary, activation, residual",
    "aten::add_": "norms, rotary, activation, residual",
    "aten::pow": "norms, rotary, activation, residual",
    "aten::mean": "norms, rotary, activation, residual",
    "aten::rsqrt": "norms, rotary, activation, residual",
    "aten::silu": "norms, rotary, activation, residual",
    "aten::neg": "norms, rotary, activation, residual",
    "aten::cat": "norms, rotary, activation, residual",
    "aten::cos": "norms, rotary, activation, residual",
    "aten::sin": "norms, rotary, activation, residual",
}
SUBMODULES = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")


def star(context: list[int], n: int) -> TokenTree:
    tree = TokenTree.from_root(context[-1])
    for j in range(n - 1):
        tree.add(0, context[j] + 1)
    return tree


def group_of(name: str) -> str:
    prefixed = next((g for prefix, g in PREFIXES if name.startswith(prefix)), None)
    return prefixed or GROUPS.get(name, "other operators")


def one_forward(adapter: ModelAdapter, context: list[int], tree: TokenTree) -> None:
    adapter.crop_to(len(context))
    adapter.tree_forward(tree, lazy=True).argmax(0)  # the greedy token of one row


def wall(adapter: ModelAdapter, context: list[int], tree: TokenTree, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        one_forward(adapter, context, tree)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def operator_groups(adapter, context, tree, rounds: int) -> tuple[dict, float]:
    """Self CPU ms per operator group per forward, and the LM head's share of it."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(rounds):
            one_forward(adapter, context, tree)
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
            module = getattr(layer, kind)
            hooks.append(module.register_forward_pre_hook(before))
            hooks.append(module.register_forward_hook(after(kind)))
    try:
        t0 = time.perf_counter()
        for _ in range(rounds):
            one_forward(adapter, context, tree)
        total = time.perf_counter() - t0
    finally:
        for h in hooks:
            h.remove()
    out = {k: round(v / rounds * 1e3, 3) for k, v in spent.items()}
    out["outside_layers_ms"] = round((total - sum(spent.values())) / rounds * 1e3, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--sizes", default="1,4,16")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--rounds", type=int, default=10, help="profiled forwards per path and size")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/forward-profile.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    paths = {
        "float32": ModelAdapter(load_model(args.target, "cpu", "float32")),
        "int8": ModelAdapter(load_model(args.target, "cpu", "int8"), trace=False),
    }
    context = random_context(paths["float32"].vocab_size, args.context, seed=0)
    results = []
    with torch.inference_mode():
        for adapter in paths.values():  # the cache filled once; each forward crops back to it
            adapter.reset()
            adapter.prefill(torch.tensor(context))
            for _ in range(3):
                one_forward(adapter, context, star(context, 4))
        for n in sizes:
            tree = star(context, n)
            # interleaved: each path's wall time taken between the other's
            walls = {name: [] for name in paths}
            for _ in range(3):
                for name, adapter in paths.items():
                    walls[name].append(wall(adapter, context, tree, args.repeats // 3 or 1))
            for name, adapter in paths.items():
                ops = operator_groups(adapter, context, tree, args.rounds)
                row = {
                    "path": name,
                    "rows": n,
                    "wall_ms": round(statistics.median(walls[name]), 3),
                    "ops_ms": {k: round(v, 3) for k, v in ops.items()},
                    "ops_total_ms": round(sum(ops.values()), 3),
                    "modules_ms": module_times(adapter, context, tree, args.rounds),
                }
                row["python_and_dispatch_ms"] = round(row["wall_ms"] - row["ops_total_ms"], 3)
                results.append(row)
                print(json.dumps(row), flush=True)
    out = {
        "what": "a tree forward of n rows over a cache of random tokens, one greedy token",
        "context": args.context,
        "threads": args.threads,
        "results": results,
        "machine": machine_info(),
        "versions": versions(),
        "timestamp": utc_timestamp(),
    }
    write_json_atomic(out, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
