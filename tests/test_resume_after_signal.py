"""A real Ctrl-C (SIGINT) to each long-running command, then `--resume`: `bench`, `calibrate`, `distill` and
`train-head` run as the `arborspec` CLI in a subprocess on tiny random models saved to temporary folders.

For each: once the command has written its first record / progress / shard / checkpoint, SIGINT; the
command exits with 130 and one line saying where its work is kept, never a traceback; what it had
written is still there and readable; a rerun with `--resume` completes, and its result has every item
exactly once (bench: every (prompt, method, temperature) record; calibrate: the uninterrupted result;
distill / train-head: an exported model that loads). Every file these tools keep is written atomically,
so a signal at any moment leaves the old file or the new one.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from arborspec.errors import ArborError

from conftest import char_tokenizer, perturbed_copy, tiny_llama, wait_until

REPO = Path(__file__).resolve().parents[1]
INTERRUPTED = 130  # every command's exit status after Ctrl-C (cli.friendly)
WORDS = ["lighthouse", "keeper", "storm", "harbour", "lantern", "gull", "tide", "rope", "island", "ship"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny random Llama target and a perturbed draft (HF folders with a character tokenizer), and prompts."""
    root = tmp_path_factory.mktemp("tiny")
    target = tiny_llama(0)
    tok = char_tokenizer()
    for name, model in (("target", target), ("draft", perturbed_copy(target, 1, 0.3))):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    lines = [f"{i}: the {WORDS[i % 10]} and the {WORDS[(3 * i) % 10]} by the {WORDS[(7 * i) % 10]}" for i in range(40)]
    (root / "prompts.txt").write_text("\n".join(lines) + "\n")
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": line}) + "\n" for line in lines))
    return root


def sigint_as_at_a_terminal() -> None:
    """In the child: SIGINT delivered as at a terminal. A suite started as a background job (`make test &`,
    `nohup`) has SIGINT ignored, children inherit that, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Command:
    """One `arborspec ...` process; stdout and stderr go to files (a full pipe would stall it)."""

    def __init__(self, args: list[str], logs: Path) -> None:
        logs.mkdir(parents=True, exist_ok=True)
        self.err_path = logs / "stderr.txt"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        with open(logs / "stdout.txt", "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", "from arborspec.cli import app; app()", *args],
                                         stdout=out, stderr=err, env=env, cwd=REPO, preexec_fn=sigint_as_at_a_terminal)

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def interrupt_when(self, ready: Callable[[], bool], timeout: float = 120) -> str:
        """SIGINT as soon as `ready()`; wait for the exit; return stderr (the exit status is checked)."""

        def running_and_ready() -> bool:
            assert self.proc.poll() is None, (
                f"ended (status {self.proc.returncode}) before it was interrupted:\n{self.stderr}")
            return ready()

        wait_until(running_and_ready, timeout, lambda: f"its first work to be written:\n{self.stderr}")
        assert self.proc.poll() is None, f"ended before it was interrupted:\n{self.stderr}"
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=120)  # the step in flight finishes first
        errs = self.stderr
        assert self.proc.returncode == INTERRUPTED, errs
        assert "Traceback" not in errs, errs
        assert "rerun with --resume" in errs.strip().splitlines()[-1], errs
        return errs

    def finish(self, timeout: float = 180) -> str:
        self.proc.wait(timeout=timeout)
        errs = self.stderr
        assert self.proc.returncode == 0, errs
        assert "Traceback" not in errs, errs
        return errs


def run(args: list[str], logs: Path) -> Command:
    return Command(args, logs)


def no_temporary_files_but_whole_ones(folder: Path) -> None:
    """A `.tmp` left by a write the signal cut short is allowed; nothing else may be half written."""
    for path in folder.rglob("*.json"):
        json.loads(path.read_text())


# ---------------------------------------------------------------------------------------------- bench
@pytest.mark.slow  # CLI subprocesses
def test_bench_resumes_after_sigint_with_every_record_once(tiny, tmp_path):
    from arborspec.bench.report import read_results
    from arborspec.bench.run import RunKey

    out = tmp_path / "bench"
    args = ["bench", "--target", str(tiny / "target"), "--draft", str(tiny / "draft"), "-m", "dyspec:budget=4",
            "--prompts", str(tiny / "prompts.jsonl"), "--num-prompts", "20", "--max-new-tokens", "24",
            "--temperatures", "0", "--warmup", "0", "--threads", "1", "--out", str(out)]
    results = out / "results.jsonl"

    def records() -> list[str]:  # complete lines after the header
        lines = results.read_text().split("\n")[1:-1] if results.is_file() else []
        return [line for line in lines if line]

    errs = run(args, tmp_path / "log1").interrupt_when(lambda: len(records()) >= 2)
    assert f"finished runs kept in {results}" in errs
    before = records()
    header, runs, _ = read_results(results)  # whole: no half-written record
    assert runs and len(runs) >= len(before) >= 2 and (out / "report.md").is_file()
    assert results.read_text().split("\n")[1:1 + len(before)] == before  # what was written is still there
    run(args + ["--resume"], tmp_path / "log2").finish()
    header, runs, _ = read_results(results)
    keys = [RunKey.of(r) for r in runs]
    assert len(keys) == len(set(keys)) == 20 * 2  # every (prompt, method, temperature) exactly once
    assert {(k.prompt_index, k.method, k.temperature) for k in keys} == {
        (i, m, 0.0) for i in range(20) for m in ("autoregressive", "dyspec:budget=4")}
    assert all(r["same_as_baseline"] for r in runs if r["method"] != "autoregressive")


# ---------------------------------------------------------------------------------------------- calibrate
@pytest.mark.slow  # CLI subprocesses
def test_calibrate_resumes_after_sigint_to_the_uninterrupted_result(tiny, tmp_path):
    from arborspec.offline.calibrate import CalibrationConfig, CalibrationProgress, calibrate, load_calibration

    out = tmp_path / "cal.json"
    partial = out.with_name("cal.json.partial")
    settings = dict(temperature=1.0, children=4, draws=4, num_prompts=16, max_new_tokens=32, max_tree_tokens=8,
                    timing_context=16, timing_repeats=1)
    args = ["calibrate", "--target", str(tiny / "target"), "--draft", str(tiny / "draft"), "--prompts",
            str(tiny / "prompts.txt"), "--out", str(out)] + [
        f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]

    def done() -> int:
        try:
            return CalibrationProgress.load(partial).tally.prompts_done
        except Exception:  # noqa: BLE001  not written yet (the rename makes it appear whole)
            return 0

    errs = run(args, tmp_path / "log1").interrupt_when(lambda: done() >= 1)
    assert f"progress kept in {partial}" in errs and not out.exists()
    kept = CalibrationProgress.load(partial)
    assert 1 <= kept.tally.prompts_done and kept.tally.trials == 4 * kept.tally.positions
    pair, cfg = (str(tiny / "target"), str(tiny / "draft")), CalibrationConfig(**settings)
    prompts = tiny / "prompts.txt"
    with pytest.raises(ArborError, match="unfinished calibration: pass --resume"):  # before any model is loaded
        calibrate(*pair, cfg, prompts_file=prompts, out=out)
    with pytest.raises(ArborError, match="draws=4, not 2"):
        calibrate(*pair, CalibrationConfig(**{**settings, "draws": 2}), prompts_file=prompts, out=out, resume=True)
    run(args + ["--resume"], tmp_path / "log2").finish()
    cal = load_calibration(out, *pair)
    assert not partial.exists()
    whole = calibrate(*pair, cfg, prompts_file=prompts, progress=False)  # never interrupted
    assert (cal.acceptance, cal.positions, cal.trials) == (whole.acceptance, whole.positions, whole.trials)


# ---------------------------------------------------------------------------------------------- distill
@pytest.mark.slow  # CLI subprocesses
def test_distill_resumes_after_sigint_and_exports_a_loadable_draft(tiny, tmp_path):
    from arborspec.offline.distill import load_data
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out, work = tmp_path / "draft", tmp_path / "work"
    args = ["distill", "--target", str(tiny / "target"), "--out", str(out), "--work-dir", str(work),
            "--layers", "1", "--hidden", "16", "--intermediate", "32", "--heads", "2", "--kv-heads", "1",
            "--num-prompts", "32", "--max-new-tokens", "32", "--gen-batch-size", "1", "--epochs", "1",
            "--batch-size", "4", "--threads", "1"]
    shards = lambda: sorted((work / "data").glob("shard_*.safetensors"))  # noqa: E731

    errs = run(args, tmp_path / "log1").interrupt_when(lambda: len(shards()) >= 1)
    assert f"kept in {work}" in errs and not out.exists()
    before = shards()
    for path in before:  # whole shards
        assert load_file(str(path))["resp_offsets"].numel() == 2
    no_temporary_files_but_whole_ones(work)
    run(args + ["--resume"], tmp_path / "log2").finish()
    assert set(before) <= set(shards()) and len(shards()) == 32  # one shard per batch, none twice
    assert sum(load_file(str(path))["resp_offsets"].numel() - 1 for path in shards()) == 32  # every prompt once
    assert 1 <= len(load_data(work / "data")) <= 32
    draft = AutoModelForCausalLM.from_pretrained(out)
    assert draft.config.vocab_size == 96 and draft.config.num_hidden_layers == 1
    assert json.loads((out / "metrics.json").read_text())["train"]["steps"] >= 1


# ---------------------------------------------------------------------------------------------- train-head
@pytest.mark.slow  # CLI subprocesses
def test_train_head_resumes_after_sigint_and_exports_a_loadable_head(tiny, tmp_path):
    from arborspec.drafters.head import load_head
    from transformers import AutoModelForCausalLM

    out, work = tmp_path / "head", tmp_path / "head.work"
    args = ["train-head", "--target", str(tiny / "target"), "--out", str(out), "--num-prompts", "16",
            "--max-new-tokens", "8", "--gen-batch-size", "4", "--draft-vocab", "0", "--epochs", "20",
            "--batch-tokens", "400", "--threads", "1"]
    checkpoint = work / "checkpoint" / "ckpt.pt"

    errs = run(args, tmp_path / "log1").interrupt_when(checkpoint.is_file)  # first written after epoch 1
    assert f"checkpoint kept in {work / 'checkpoint'}" in errs and not out.exists()
    state = torch.load(checkpoint, weights_only=False)["state"]
    assert 1 <= state["step"] and state["history"]
    no_temporary_files_but_whole_ones(work)
    shards = sorted((work / "data").glob("shard_*.safetensors"))
    run(args + ["--resume"], tmp_path / "log2").finish()
    assert sorted((work / "data").glob("shard_*.safetensors")) == shards  # the data was not made again
    training = json.loads((out / "training.json").read_text())
    assert training["steps"] == training["total_steps"] and not training["interrupted"]
    head = load_head(out, AutoModelForCausalLM.from_pretrained(tiny / "target"))
    assert head.vocab_size == 96


def test_head_training_resumed_after_sigint_ends_with_the_uninterrupted_weights(tmp_path, monkeypatch):
    """The SIGINT lands mid-epoch 2 (in-process): the checkpoint, then `resume`, must replay the same batches."""
    from arborspec.offline import train_head as module
    from arborspec.offline.head_data import HeadSequence
    from arborspec.offline.train_head import HeadTrainConfig, token_batches, train

    target = tiny_llama(0).requires_grad_(False)
    gen = torch.Generator().manual_seed(0)
    seqs = [HeadSequence(torch.randint(3, 96, (n,), generator=gen), torch.randn(n - 1, 48, generator=gen).half(), 4)
            for n in range(12, 36, 2)]
    cfg = dict(draft_vocab=0, epochs=3, lr=3e-3, warmup_steps=2, batch_tokens=64, ttt_steps=2, ckpt_every=10_000)
    whole, info = train(HeadTrainConfig(out=str(tmp_path / "a"), **cfg), target, seqs, seqs[:2], progress=False)
    per_epoch = len(token_batches(seqs, 64, 640, random.Random(0)))
    real, calls = module.head_losses, []

    def sigint_in_epoch_two(*args, **kwargs):
        calls.append(1)
        if len(calls) == per_epoch + 1 + 3:  # epoch 1, its held-out evaluation (one batch), 3 steps of epoch 2
            signal.raise_signal(signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "head_losses", sigint_in_epoch_two)
    part = HeadTrainConfig(out=str(tmp_path / "b"), **cfg)
    _, cut = train(part, target, seqs, seqs[:2], progress=False)
    assert cut["interrupted"] and cut["steps"] == per_epoch + 3
    monkeypatch.setattr(module, "head_losses", real)
    resumed, info2 = train(HeadTrainConfig(out=str(tmp_path / "b"), resume=True, **cfg), target, seqs, seqs[:2],
                           progress=False)
    assert info2["steps"] == info["steps"] and not info2["interrupted"]
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
