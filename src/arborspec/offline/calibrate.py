"""Calibrate a target/draft pair for Sequoia (Chen et al. 2024, Sec. 3.2-3.3 and App. C.2).

Two measurements, saved together as JSON with the pair, the sampling settings
and the machine:

* **Positional acceptance vector** `p_k`. The target writes continuations of
  calibration prompts (a small built-in list of everyday instructions — never
  MT-Bench or HumanEval, which are evaluation sets — or a user file). At every
  position of prompt + continuation we draw K children *without replacement*
  from the draft (Gumbel top-k on the draft distribution after the draft-side
  transform) and run the multi-round `rejection` verifier (Sequoia Alg. 1) on
  that one-level tree against the target's distribution, `draws` times with
  fresh noise. `p_k` = share of trials that accepted the k-th child.
* **Costs**. `t(k)` = target forward time for k new tokens over a cache of
  `timing_context` tokens, relative to one token (measured at powers of two,
  linearly interpolated), and `c` = one draft forward (one new token on the
  draft's cache) relative to one target token.

**Progress.** With an output file, what is measured is also kept in `<out>.partial`
(`progress_path`), rewritten atomically after every prompt and after the timing table:
the histogram so far and the sampler's random state, so Ctrl-C loses at most the prompt
in flight and `resume=True` (`--resume`) continues to exactly the result of an
uninterrupted run. Without `resume` an existing progress file is refused, as is a
resume with other settings; the progress file is removed once the result is written.

`write_sequoia_shape` turns a calibration into a Sequoia shape file: the DP
optimum for a chosen (size, depth), or the hardware-aware choice of
`sequoia_dp.choose_size`. The shape is filled at run time by the `sequoia`
builder and verified with `rejection` (without replacement).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..builders.sequoia_dp import choose_size, optimal_shape, predicted_speedup
from ..builders.shapes import save_shape
from ..common.chat import encode_prompt, eos_ids
from ..common.jsonfiles import read_json_file, write_json_atomic
from ..common.progress import progress_enumerate
from ..common.provenance import machine_info, utc_timestamp
from ..common.vocab import check_vocab_size
from ..engine.adapter import ModelAdapter
from ..engine.contracts import Drafter
from ..engine.cost import CostCurve, measure_cost_curve
from ..engine.decode import DecodeConfig, autoregressive_generate
from ..engine.placement import execution_device
from ..engine.sampling import (
    SamplingConfig,
    gumbel_like,
    probs_from_logits,
    sample_without_replacement,
)
from ..engine.tree import TokenTree
from ..engine.verifiers import rejection
from ..errors import ArborError, Interrupted
from ..models import default_draft, load_pair
from .prompts import read_prompts

CALIBRATION_FORMAT = "arborspec-calibration/1"
PROGRESS_FORMAT = "arborspec-calibration-progress/1"


@dataclass(kw_only=True)
class CalibrationConfig:
    temperature: float = 0.6  # the sampling settings the calibration is valid for
    top_k: int = 0
    top_p: float = 1.0
    children: int = 16  # K: children sampled per position (length of the acceptance vector)
    draws: int = 4  # independent K-child draws per position
    num_prompts: int = 12
    max_new_tokens: int = 64  # continuation the target writes per prompt
    max_tree_tokens: int = 128  # t(k) is measured for k = 1, 2, 4, ... up to this
    timing_context: int = 128  # cache length for the timing forwards
    timing_repeats: int = 5
    seed: int = 0

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_k, self.top_p)


@dataclass(kw_only=True)
class Calibration:
    target: str
    draft: str
    vocab_size: int
    sampling: dict  # temperature, top_k, top_p
    acceptance: list[float]  # p_1 .. p_K
    positions: int  # positions measured
    trials: int  # positions x draws
    time_tokens: list[int]  # k at which t was measured
    time_relative: list[float]  # t(k): forward time for k tokens / for 1 token
    time_one_token_s: float  # target forward, 1 token, seconds
    draft_cost: float  # c: draft forward / target forward (1 token each)
    prompts_source: str
    config: dict
    machine: dict
    created: str
    format: str = CALIBRATION_FORMAT
    first_child_stderr: float = 0.0

    @property
    def cost(self) -> CostCurve:
        return CostCurve(
            tuple(self.time_tokens),
            tuple(self.time_relative),
            self.time_one_token_s,
            self.draft_cost,
        )

    def t(self, tokens: int) -> float:
        """Relative target forward time for `tokens` new tokens (the engine's `CostCurve.t`)."""
        return self.cost.t(tokens)

    def save(self, path: str | Path) -> None:
        write_json_atomic(asdict(self), path)


# ---------------------------------------------------------------------------- acceptance
def one_level_tree(
    draft_probs: torch.Tensor, k: int, gumbel: torch.Tensor, root_token: int = 0
) -> TokenTree:
    """A root with up to k children drawn without replacement from `draft_probs`
    `[V]` (Gumbel top-k)."""
    tree = TokenTree.from_root(root_token, "without_replacement")
    tree.child_dists[0] = draft_probs
    for y in sample_without_replacement(draft_probs, k, gumbel):
        tree.add(0, y, draft_prob=float(draft_probs[y]))
    return tree


def accepted_child_index(
    target_logits: torch.Tensor,  # [V]
    draft_probs: torch.Tensor,  # [V] after the draft-side transform
    k: int,
    cfg: SamplingConfig,
    generator: torch.Generator,
    ordered: bool = False,
) -> int | None:
    """Sample k children (`ordered`: take the k most likely, as ordered draws at temperature 0 do),
    verify them with `rejection`; the 0-based index of the accepted child, or None."""
    noise = torch.zeros_like(draft_probs) if ordered else gumbel_like(draft_probs, generator)
    tree = one_level_tree(draft_probs, k, noise)
    logits = target_logits.unsqueeze(0).expand(tree.num_nodes, -1)  # [N, V]; only row 0 decides
    result = rejection(tree, logits, cfg, generator)
    return tree.children[0].index(result.accepted[0]) if result.accepted else None


def draft_logits_along(
    drafter: Drafter, ids: list[int], start: int, target: ModelAdapter | None = None
) -> torch.Tensor:  # [len(ids) - start, V]
    """The draft's next-token logits after ids[:i+1] for i = start .. len(ids)-1 (incremental
    `begin`). A drafter that reads the target's features (the draft head) first observes those of
    `ids` from `target`."""
    drafter.reset()
    drafter.observe_sequence(target, ids)
    return torch.stack([drafter.begin(ids[: i + 1]) for i in range(start, len(ids))])


@torch.inference_mode()
def target_logits_along(model, ids: list[int], start: int) -> torch.Tensor:  # [len(ids) - start, V]
    out = model(input_ids=torch.tensor([ids], device=execution_device(model)), use_cache=False)
    return out.logits[0, start:].float().cpu()


@dataclass(kw_only=True)
class AcceptanceTally:
    """The accepted-child histogram over the first `prompts_done` prompts, and the sampler's
    random state then."""

    hits: list[int]  # trials that accepted the k-th child, k = 1..K
    positions: int = 0
    trials: int = 0
    prompts_done: int = 0
    # state of the acceptance sampler after those prompts (base64); "" = not started
    generator: str = ""

    @property
    def acceptance(self) -> list[float]:
        return [h / max(self.trials, 1) for h in self.hits]


def _sampler(tally: AcceptanceTally, seed: int) -> torch.Generator:
    gen = torch.Generator()
    if not tally.generator:
        return gen.manual_seed(seed)
    gen.set_state(torch.frombuffer(bytearray(base64.b64decode(tally.generator)), dtype=torch.uint8))
    return gen


def measure_acceptance(
    target_model,
    drafter: Drafter,
    prompts: list[list[int]],
    cfg: CalibrationConfig,
    eos_token_ids: tuple[int, ...] = (),
    progress: bool = True,
    start: AcceptanceTally | None = None,
    on_prompt: Callable[[AcceptanceTally], None] | None = None,
) -> AcceptanceTally:
    """Histogram of the accepted child index over all positions of all prompts.

    `start`: a tally of the first prompts (resume); `on_prompt` receives a new
    tally after every prompt.
    """
    sampling = cfg.sampling
    draft_side = sampling.draft_side()
    tally = start or AcceptanceTally(hits=[0] * cfg.children)
    gen = _sampler(tally, cfg.seed)
    target = ModelAdapter(target_model)
    first = tally.prompts_done
    for j, prompt in progress_enumerate(prompts[first:], "acceptance", progress):
        i = first + j
        dcfg = DecodeConfig(
            max_new_tokens=cfg.max_new_tokens,
            sampling=sampling,
            seed=cfg.seed + i,
            eos_token_ids=eos_token_ids,
        )
        ids = list(prompt) + autoregressive_generate(target, list(prompt), dcfg).output_ids
        start_pos = max(len(prompt) - 1, 0)
        t_logits = target_logits_along(target_model, ids, start_pos)  # [P, V]
        # [P, V]
        d_probs = probs_from_logits(
            draft_logits_along(drafter, ids, start_pos, target).cpu(), draft_side
        )
        hits, trials = list(tally.hits), tally.trials
        for row in range(t_logits.shape[0]):
            for _ in range(cfg.draws):
                k = accepted_child_index(
                    t_logits[row],
                    d_probs[row],
                    cfg.children,
                    sampling,
                    gen,
                    draft_side.ordered_draws,
                )
                if k is not None:
                    hits[k] += 1
                trials += 1
        state = base64.b64encode(gen.get_state().numpy().tobytes()).decode("ascii")
        # one assignment: never half updated
        tally = AcceptanceTally(
            hits=hits,
            positions=tally.positions + t_logits.shape[0],
            trials=trials,
            prompts_done=i + 1,
            generator=state,
        )
        if on_prompt is not None:
            on_prompt(tally)
    return tally


# ---------------------------------------------------------------------------- costs
def timing_sizes(max_tree_tokens: int) -> list[int]:
    """k = 1, 2, 4, ... up to `max_tree_tokens` (and it)."""
    return sorted(
        {1 << i for i in range(max_tree_tokens.bit_length()) if 1 << i <= max_tree_tokens}
        | {max_tree_tokens}
    )


# ---------------------------------------------------------------------------- progress (resume)
def progress_path(out: str | Path) -> Path:
    """Where an unfinished calibration keeps its progress: `<out>.partial`,
    beside the output file."""
    out = Path(out)
    return out.with_name(out.name + ".partial")


@dataclass(kw_only=True)
class CalibrationProgress:
    """What a calibration has measured so far: saved after every prompt and
    after the timing table."""

    # what a resume must match: the pair, the vocabulary, the prompts and every config field
    settings: dict
    tally: AcceptanceTally
    timing: dict | None = None  # the measured cost curve (`CostCurve.as_dict`), once measured
    format: str = PROGRESS_FORMAT

    def save(self, path: str | Path) -> None:
        write_json_atomic(asdict(self), path)

    @classmethod
    def load(cls, path: str | Path) -> CalibrationProgress:
        data = read_json_file(path, "calibration progress file")
        try:
            if data.get("format") != PROGRESS_FORMAT:
                raise TypeError(f"format {data.get('format')!r}")
            return cls(
                settings=dict(data["settings"]),
                tally=AcceptanceTally(**data["tally"]),
                timing=data["timing"],
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ArborError(
                f"{str(path)!r} is not a calibration progress file ({exc}): delete it to start over"
            ) from None


def calibration_settings(
    target_name: str, draft_name: str, cfg: CalibrationConfig, prompts_source: str
) -> dict:
    """The settings a progress file records and a resume must match (vocabulary and prompt ids are
    added once the models are loaded)."""
    return {
        "target": target_name,
        "draft": draft_name,
        "prompts_source": prompts_source,
        **asdict(cfg),
    }


def open_progress(
    path: str | Path | None, settings: dict, resume: bool
) -> CalibrationProgress | None:
    """The saved progress at `path` to continue from, if any; refuse it without `resume` or when one
    of `settings` differs (one-line ArborErrors)."""
    if path is None or not Path(path).exists():
        return None
    if not resume:
        raise ArborError(
            f"{path} holds an unfinished calibration: pass --resume to continue it, or "
            "delete it to start over"
        )
    saved = CalibrationProgress.load(path)
    for key, value in settings.items():
        if saved.settings.get(key) != value:
            raise ArborError(
                f"{path} was made with {key}={saved.settings.get(key)!r}, not {value!r}: "
                "resume with the same settings, or delete it to start over"
            )
    return saved


def _prompts_digest(prompts: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(prompts).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------- entry points
def calibrate_models(
    target_model,
    drafter: Drafter,
    prompts: list[list[int]],
    cfg: CalibrationConfig | None = None,
    *,
    target_name: str,
    draft_name: str,
    prompts_source: str = "given token ids",
    eos_token_ids: tuple[int, ...] = (),
    progress: bool = True,
    progress_file: str | Path | None = None,
    resume: bool = False,
) -> Calibration:
    """Measure the acceptance vector and the costs for loaded models (`prompts` as token ids).

    `progress_file`: keep the progress there (see the module docstring; the caller removes it once
    the result is saved); `resume`: continue from it.
    """
    cfg = cfg or CalibrationConfig()
    check_vocab_size(
        drafter.vocab_size,
        target_model.get_output_embeddings().weight.shape[0],
        fix="calibrate a pair that shares a tokenizer",
    )
    if not prompts:
        raise ArborError("no calibration prompts")
    settings = {
        **calibration_settings(target_name, draft_name, cfg, prompts_source),
        "vocab_size": drafter.vocab_size,
        "prompts": _prompts_digest(prompts),
    }
    state = open_progress(progress_file, settings, resume)
    state = state or CalibrationProgress(
        settings=settings, tally=AcceptanceTally(hits=[0] * cfg.children)
    )

    def keep(tally: AcceptanceTally) -> None:
        state.tally = tally
        if progress_file is not None:
            state.save(progress_file)

    tally = measure_acceptance(
        target_model, drafter, prompts, cfg, eos_token_ids, progress, state.tally, keep
    )
    if state.timing is None:
        curve = measure_cost_curve(
            ModelAdapter(target_model),
            drafter,
            cfg.timing_context,
            timing_sizes(cfg.max_tree_tokens),
            cfg.timing_repeats,
            cfg.seed,
        )
        state.timing = curve.as_dict()
        keep(tally)
    curve = CostCurve.from_dict(state.timing)
    acceptance, trials = tally.acceptance, tally.trials
    p1 = acceptance[0]
    return Calibration(
        target=target_name,
        draft=draft_name,
        vocab_size=drafter.vocab_size,
        sampling=asdict(cfg.sampling),
        acceptance=acceptance,
        positions=tally.positions,
        trials=trials,
        time_tokens=list(curve.tokens),
        time_relative=list(curve.relative),
        time_one_token_s=curve.one_token_s,
        draft_cost=curve.draft_cost,
        prompts_source=prompts_source,
        config=asdict(cfg),
        machine=machine_info(execution_device(target_model)),
        created=utc_timestamp(),
        first_child_stderr=(p1 * (1 - p1) / max(trials, 1)) ** 0.5,
    )


def calibrate(
    target: str = "embedded",
    draft: str | None = None,
    cfg: CalibrationConfig | None = None,
    *,
    prompts_file: str | Path | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    device: str = "cpu",
    dtype: str = "float32",
    progress: bool = True,
    device_map: str | dict | None = None,
    max_memory: str | dict | None = None,
    offload_folder: str | None = None,
) -> Calibration:
    """Load the pair by name (draft None = the target's default draft), calibrate on chat-formatted
    prompts, and write the JSON to `out` when given, keeping the progress beside it
    (`progress_path`) until then. Ctrl-C after the first prompt raises `Interrupted` naming the
    progress file; `resume` continues from it."""
    cfg = cfg or CalibrationConfig()
    texts, source = read_prompts(prompts_file, cfg.num_prompts)
    partial = progress_path(out) if out is not None else None
    draft = draft or default_draft(target)
    # refuse before loading
    open_progress(partial, calibration_settings(target, draft, cfg, source), resume)
    pair = load_pair(target, draft, device, dtype, device_map, max_memory, offload_folder)
    try:
        result = calibrate_models(
            pair.target.model,
            pair.drafter,
            [encode_prompt(pair.tokenizer, t) for t in texts],
            cfg,
            target_name=pair.target_name,
            draft_name=pair.draft_name,
            prompts_source=source,
            eos_token_ids=eos_ids(pair.tokenizer, pair.target.model),
            progress=progress,
            progress_file=partial,
            resume=resume,
        )
        if out is not None:
            result.save(out)
            partial.unlink(missing_ok=True)
    except KeyboardInterrupt:
        if partial is not None and partial.exists():
            raise Interrupted(
                f"interrupted; progress kept in {partial}; rerun with --resume to continue"
            ) from None
        raise
    return result


def load_calibration(
    path: str | Path, target: str | None = None, draft: str | None = None
) -> Calibration:
    """Read a calibration JSON; raise a one-line ArborError when it is malformed
    or for another pair."""
    path = Path(path)
    data = read_json_file(path, "calibration file", "run `arborspec calibrate` first")
    if not isinstance(data, dict) or data.get("format") != CALIBRATION_FORMAT:
        raise ArborError(
            f"{str(path)!r} is not an arborspec calibration file (expected format "
            f"{CALIBRATION_FORMAT})"
        )
    try:
        cal = Calibration(**data)
    except TypeError as exc:
        raise ArborError(f"calibration file {str(path)!r} is malformed ({exc})") from None
    acc = cal.acceptance
    if (
        not acc
        or not all(isinstance(x, (int, float)) and 0 <= x <= 1 for x in acc)
        or sum(acc) > 1 + 1e-6
    ):
        raise ArborError(f"calibration file {str(path)!r} has an invalid acceptance vector")
    if len(cal.time_tokens) != len(cal.time_relative) or not cal.time_tokens:
        raise ArborError(f"calibration file {str(path)!r} has inconsistent timing tables")
    for role, want, have in [("target", target, cal.target), ("draft", draft, cal.draft)]:
        if want is not None and want != have:
            raise ArborError(
                f"calibration file {str(path)!r} was measured for {role} {have!r}, not {want!r}: "
                f"recalibrate with `arborspec calibrate --{role} {want}`"
            )
    return cal


def write_sequoia_shape(
    calibration: Calibration | str | Path,
    out: str | Path,
    size: int | None = None,
    depth: int | None = None,
    max_size: int = 128,
    max_depth: int = 12,
) -> tuple[list[list[int]], dict]:
    """Write the Sequoia shape for a calibration: DP optimum at (size, depth), or the
    hardware-aware choice.

    With `size` given, `depth` defaults to unbounded (= size). Without `size`,
    (size, depth) maximise the predicted speedup over sizes <= max_size and
    depths <= max_depth. Returns (shape, metadata written beside it).
    """
    cal = calibration if isinstance(calibration, Calibration) else load_calibration(calibration)
    choice = "given"
    if size is None:
        size, depth = choose_size(cal.acceptance, cal.t, cal.draft_cost, max_size, max_depth)
        choice = "hardware-aware"
    depth = size if depth is None else depth
    shape, score = optimal_shape(cal.acceptance, size, depth)
    meta = {
        "target": cal.target,
        "draft": cal.draft,
        "sampling": cal.sampling,
        "acceptance": cal.acceptance,
        "size": size,
        "depth": max(len(p) for p in shape),
        "depth_bound": depth,
        "choice": choice,
        "expected_accepted_length": score,
        "predicted_speedup": predicted_speedup(cal.acceptance, cal.t, cal.draft_cost, size, depth),
        "calibration_created": cal.created,
        "machine": cal.machine,
    }
    save_shape(out, shape, **meta)
    return shape, meta
