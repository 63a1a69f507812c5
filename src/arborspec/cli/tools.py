"""The offline tools' commands: calibration, C2T and draft training, the draft's quality (the
developers' tools are under `arborspec dev`, `dev.py`)."""

from __future__ import annotations

from pathlib import Path

from typer import Option as Opt

from ..errors import ArborError
from .base import app, err, friendly
from .options import ModelOptions, RunOptions, SamplingOptions, check_positive, grouped

PLACED = ("target", "draft", "device", "dtype", "device_map", "max_memory", "offload_folder")


@app.command()
@friendly
@grouped(
    "sampling", SamplingOptions, only=("temperature", "top_k", "top_p", "seed"), temperature=0.6
)
@grouped("models", ModelOptions, only=PLACED)
def calibrate(
    out: Path = Opt(
        Path("calibration.json"),
        "--out",
        "-o",
        help="where to write the calibration JSON (progress is kept in OUT.partial until then)",
    ),
    resume: bool = Opt(
        False,
        "--resume",
        help="continue an interrupted calibration from OUT.partial (same settings)",
    ),
    children: int = Opt(
        16, "--children", help="K: children sampled per position (length of the acceptance vector)"
    ),
    draws: int = Opt(4, "--draws", help="independent K-child draws per position"),
    num_prompts: int = Opt(12, "--num-prompts"),
    prompts: Path | None = Opt(
        None,
        "--prompts",
        help="calibration prompts (one per line or a JSON list); default: built-in",
    ),
    max_new_tokens: int = Opt(64, "--max-new-tokens"),
    max_tree_tokens: int = Opt(
        128, "--max-tree-tokens", help="t(n) is measured for n = 1, 2, 4, ... up to this"
    ),
    timing_context: int = Opt(128, "--timing-context"),
    timing_repeats: int = Opt(5, "--timing-repeats"),
    models: ModelOptions = ModelOptions(),
    sampling: SamplingOptions = SamplingOptions(),
) -> None:
    """Sequoia calibration: positional acceptance vector, target forward time t(n) and
    draft/target cost c; resumable, Ctrl-C safe."""
    from ..offline.calibrate import CalibrationConfig
    from ..offline.calibrate import calibrate as run_calibration

    models.check_placement()
    cfg = CalibrationConfig(
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        children=children,
        draws=draws,
        num_prompts=num_prompts,
        max_new_tokens=max_new_tokens,
        max_tree_tokens=max_tree_tokens,
        timing_context=timing_context,
        timing_repeats=timing_repeats,
        seed=sampling.seed,
    )
    cal = run_calibration(
        models.target,
        models.draft,
        cfg,
        prompts_file=prompts,
        out=out,
        resume=resume,
        device=models.device,
        dtype=models.resolved_dtype,
        device_map=models.device_map,
        max_memory=models.max_memory,
        offload_folder=models.offload_folder,
    )
    shown = ", ".join(f"{x:.3f}" for x in cal.acceptance[:6])
    err.print(
        f"acceptance p_1.. = [{shown}, ...]; c = {cal.draft_cost:.3f}; written to {out}",
        highlight=False,
    )


@app.command("train-c2t")
@friendly
@grouped("sampling", SamplingOptions, only=("temperature", "top_p", "seed"))
@grouped("models", ModelOptions, only=PLACED)
def train_c2t(
    out: Path | None = Opt(
        None,
        "--out",
        "-o",
        help="classifier file (.safetensors); default: the shipped location for the embedded pair",
    ),
    prompts: Path | None = Opt(
        None, "--prompts", help="training prompts (one per line or a JSON list); default: built-in"
    ),
    num_prompts: int = Opt(24, "--num-prompts"),
    max_new_tokens: int = Opt(48, "--max-new-tokens"),
    positions_per_prompt: int = Opt(8, "--positions-per-prompt"),
    k: int = Opt(8, "--k", help="children per node and frontier width of the expanded trees"),
    depth: int = Opt(6, "--depth", help="layers of the expanded trees"),
    neg_per_pos: int = Opt(4, "--neg-per-pos"),
    epochs: int = Opt(40, "--epochs"),
    lr: float = Opt(3e-3, "--lr"),
    batch_size: int = Opt(1024, "--batch-size"),
    holdout: float = Opt(0.2, "--holdout"),
    beta: float = Opt(0.5, "--beta"),
    models: ModelOptions = ModelOptions(),
    sampling: SamplingOptions = SamplingOptions(),
) -> None:
    """Train the C2T pruning classifier on large expanded trees labelled by the target."""
    from ..offline.c2t import C2TConfig
    from ..offline.c2t import train_c2t as run_training

    models.check_placement()
    cfg = C2TConfig(
        k=k,
        depth=depth,
        num_prompts=num_prompts,
        max_new_tokens=max_new_tokens,
        positions_per_prompt=positions_per_prompt,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        neg_per_pos=neg_per_pos,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        holdout=holdout,
        beta=beta,
        seed=sampling.seed,
    )
    _, metrics = run_training(
        models.target,
        models.draft,
        cfg,
        out=out,
        prompts_file=prompts,
        device=models.device,
        dtype=models.resolved_dtype,
        device_map=models.device_map,
        max_memory=models.max_memory,
        offload_folder=models.offload_folder,
    )
    shown = {k_: v for k_, v in metrics.items() if isinstance(v, (int, float))}
    err.print("metrics: " + ", ".join(f"{k_}={v:.4g}" for k_, v in shown.items()), highlight=False)
    for row in metrics.get("by_beta", []):
        err.print("  " + ", ".join(f"{k_}={v:.3g}" for k_, v in row.items()), highlight=False)


@app.command()
@friendly
@grouped("run", RunOptions, threads=1)
@grouped("models", ModelOptions, only=("target", "device"))
def distill(
    out: Path = Opt(..., "--out", "-o", help="HF model directory to write the draft to"),
    layers: int = Opt(3, "--layers"),
    hidden: int = Opt(128, "--hidden"),
    intermediate: int = Opt(512, "--intermediate"),
    heads: int = Opt(4, "--heads"),
    kv_heads: int = Opt(2, "--kv-heads"),
    num_prompts: int = Opt(
        2000, "--num-prompts", help="training prompts (built-in, never MT-Bench/HumanEval)"
    ),
    max_new_tokens: int = Opt(160, "--max-new-tokens", help="target response length per prompt"),
    gen_batch_size: int = Opt(16, "--gen-batch-size"),
    epochs: float = Opt(3.0, "--epochs"),
    lr: float = Opt(2e-3, "--lr"),
    batch_size: int = Opt(8, "--batch-size"),
    stages: str = Opt("data,train,export", "--stages"),
    models: ModelOptions = ModelOptions(),
    run: RunOptions = RunOptions(),
) -> None:
    """Distil a small draft model from a target (sequence-level KD + top-k soft labels);
    resumable."""
    from ..offline.distill import DistillConfig
    from ..offline.distill import distill as run_distill

    cfg = DistillConfig(
        target=models.target,
        out_dir=str(out),
        work_dir=str(run.work_dir or ""),
        layers=layers,
        hidden=hidden,
        intermediate=intermediate,
        heads=heads,
        kv_heads=kv_heads,
        num_prompts=num_prompts,
        max_new_tokens=max_new_tokens,
        gen_batch_size=gen_batch_size,
        data_time_budget_s=run.data_time_budget_s,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        train_time_budget_s=run.train_time_budget_s,
        stages=stages,
        resume=run.resume,
        threads=run.threads,
        device=models.device,
        seed=run.seed,
    )
    path = run_distill(cfg)
    err.print(f"draft written to {path}; use it with --draft {path}", highlight=False)


@app.command("train-head")
@friendly
@grouped("run", RunOptions)
@grouped("models", ModelOptions, only=("target", "device"))
def train_head(
    out: Path = Opt(
        ..., "--out", "-o", help="directory to write the head to (head.safetensors + head.json)"
    ),
    num_prompts: int = Opt(
        6000, "--num-prompts", help="training prompts (built-in pool, never benchmark data)"
    ),
    max_new_tokens: int = Opt(160, "--max-new-tokens", help="target answer length per prompt"),
    gen_batch_size: int = Opt(
        32, "--gen-batch-size", help="prompts answered together (left-padded)"
    ),
    skip_data: bool = Opt(
        False, "--skip-data", help="train on the data shards already in the work dir"
    ),
    self_instruct: int = Opt(
        0,
        "--self-instruct",
        help="also N conversations whose user "
        "messages the target writes itself (chat-like data; needs a chat "
        "template)",
    ),
    self_instruct_openings: bool = Opt(
        False,
        "--self-instruct-openings",
        help="start each "
        "self-instructed message with a generic opening (Write, "
        "Imagine you are, Explain, ...) that the target "
        "continues",
    ),
    draft_vocab: int = Opt(
        8192, "--draft-vocab", help="FR-Spec: draft only among the K most frequent tokens (0 = all)"
    ),
    epochs: float = Opt(2.0, "--epochs"),
    lr: float = Opt(2e-3, "--lr"),
    batch_tokens: int = Opt(384, "--batch-tokens", help="padded tokens per training step"),
    ttt_steps: int = Opt(
        2, "--ttt-steps", help="training-time-test passes (1 = plain EAGLE training)"
    ),
    ce_weight: float = Opt(
        0.1,
        "--ce-weight",
        help="weight of the cross-entropy against the "
        "target's next-token distribution, beside the feature regression "
        "(weight 1)",
    ),
    init_from: Path | None = Opt(
        None,
        "--init-from",
        help="start from an exported head's "
        "weights (e.g. to continue on more data with a new "
        "schedule)",
    ),
    models: ModelOptions = ModelOptions(),
    run: RunOptions = RunOptions(),
) -> None:
    """Train an EAGLE-style draft head on the target's own answers and features; resumable,
    Ctrl-C safe."""
    import torch

    from ..offline.head_data import HeadDataConfig
    from ..offline.train_head import HeadTrainConfig
    from ..offline.train_head import train_head as run_training

    if run.threads:
        torch.set_num_threads(run.threads)
    check_positive(
        num_prompts=num_prompts,
        max_new_tokens=max_new_tokens,
        gen_batch_size=gen_batch_size,
        batch_tokens=batch_tokens,
        ttt_steps=ttt_steps,
    )
    if epochs <= 0 or lr <= 0 or draft_vocab < 0:
        raise ArborError("--epochs and --lr must be > 0 and --draft-vocab >= 0")
    if self_instruct < 0:
        raise ArborError(f"--self-instruct must be >= 0, got {self_instruct}")
    if ce_weight < 0:
        raise ArborError(f"--ce-weight must be >= 0, got {ce_weight}")
    data = HeadDataConfig(
        target=models.target,
        num_prompts=num_prompts,
        max_new_tokens=max_new_tokens,
        batch_size=gen_batch_size,
        seed=run.seed,
        time_budget_s=run.data_time_budget_s,
        query_openings=self_instruct_openings,
    )
    cfg = HeadTrainConfig(
        target=models.target,
        out=str(out),
        work_dir=str(run.work_dir or ""),
        data=data,
        skip_data=skip_data,
        self_instruct=self_instruct,
        draft_vocab=draft_vocab,
        epochs=epochs,
        lr=lr,
        batch_tokens=batch_tokens,
        ttt_steps=ttt_steps,
        ce_weight=ce_weight,
        time_budget_s=run.train_time_budget_s,
        resume=run.resume,
        init_from=str(init_from or ""),
        seed=run.seed,
        device=models.device,
    )
    path = run_training(cfg)
    err.print(f"head written to {path}; use it with --draft {path}", highlight=False)


@app.command("draft-quality")
@friendly
@grouped("models", ModelOptions, only=("target", "draft", "draft_logits"), draft_logits="float")
def draft_quality(
    n_mtbench: int = Opt(80, "--n-mtbench", help="MT-Bench first turns to use (of 80; 0 skips)"),
    n_humaneval: int = Opt(
        40, "--n-humaneval", help="HumanEval prompts to use (of 164; 0 skips)"
    ),
    max_new_tokens: int | None = Opt(
        None,
        "--max-new-tokens",
        help="target answer length "
        "per prompt (default: 64 for a draft model, 128 for a "
        "draft head)",
    ),
    temperature: float = Opt(
        0.6,
        "--temperature",
        "-t",
        help="the temperature of the chain acceptance reported beside temperature 0",
    ),
    cache_len: int = Opt(128, "--cache-len", help="KV-cache length of the timed forwards"),
    reps: int | None = Opt(
        None, "--reps", help="timed forwards (default: 40 for a draft model, 30 for a draft head)"
    ),
    threads: int = Opt(0, "--threads", help="torch threads (0 = torch's default)"),
    gen_batch_size: int = Opt(
        8, "--gen-batch-size", help="prompts answered together (a draft model's statistics)"
    ),
    work_dir: Path = Opt(
        Path("runs/head/heldout"),
        "--work-dir",
        help="a draft head's held-out answers and features (resumable)",
    ),
    out: Path | None = Opt(
        None, "--out", "-o", help="write the JSON here (default: stdout only)"
    ),
    models: ModelOptions = ModelOptions(),
) -> None:
    """Held-out quality and cost of a draft model or draft head: teacher-forced top-1 agreement
    (per tree depth for a head), expected chain acceptance, and the draft's cost relative to the
    target, on MT-Bench first turns and HumanEval prompts (never trained on)."""
    import torch

    from ..common.jsonfiles import report_json
    from ..models import NGRAM_DRAFT, default_draft, head_int8, is_head_dir, resolve_head_dir

    draft = models.draft or default_draft(models.target)
    if draft == NGRAM_DRAFT:
        raise ArborError(
            "the n-gram drafter has no model to measure: give --draft a draft model or a draft head"
        )
    given = {"max_new_tokens": max_new_tokens, "reps": reps}
    check_positive(cache_len=cache_len, **{k: v for k, v in given.items() if v is not None})
    if n_mtbench < 0 or n_humaneval < 0:
        raise ArborError("--n-mtbench and --n-humaneval must be >= 0 (0 skips that set)")
    if threads:
        torch.set_num_threads(threads)
    if is_head_dir(draft):
        from ..offline.head_quality import measure

        int8 = head_int8(models.draft_logits, "cpu", False)
        result = measure(
            str(resolve_head_dir(draft)),
            models.target,
            work_dir=str(work_dir),
            n_mtbench=n_mtbench,
            n_humaneval=n_humaneval,
            max_new_tokens=max_new_tokens or 128,
            temperature=temperature,
            cache_len=cache_len,
            reps=reps or 30,
            int8_logits=int8,
            int8_layers=int8,
        )
        result["head"] = draft  # the name given (the resolved path depends on the install)
    else:
        from ..offline.draft_quality import measure

        result = measure(
            models.target,
            draft,
            n_mtbench=n_mtbench,
            n_humaneval=n_humaneval,
            max_new_tokens=max_new_tokens or 64,
            temperature=temperature,
            cache_len=cache_len,
            reps=reps or 40,
            gen_batch_size=gen_batch_size,
        )
    report_json(result, str(out) if out else None)
