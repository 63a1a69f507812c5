"""Ctrl-C keeps what was generated: the decode loops raise `GenerationInterrupted` (a `KeyboardInterrupt`)
carrying the partial result, and `arborspec generate` prints it with its statistics."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from arborspec.builders.registry import make_builder
from arborspec.drafters import ModelDrafter
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from arborspec.engine.stats import GenerationInterrupted

from conftest import wait_until
from test_resume_after_signal import sigint_as_at_a_terminal

PROMPT = [5, 17, 33, 8, 9, 40]


class StopAfter:
    """An `on_tokens` callback that presses Ctrl-C on its `calls`-th call."""

    def __init__(self, calls: int) -> None:
        self.calls, self.seen = calls, []

    def __call__(self, new: list[int]) -> None:
        self.seen += new
        self.calls -= 1
        if self.calls == 0:
            raise KeyboardInterrupt


@pytest.mark.parametrize("method", ["autoregressive", "dyspec", "opt-tree"])
def test_interrupted_generation_keeps_its_tokens_and_steps(tiny_pair, method):
    target, draft = tiny_pair
    cfg = DecodeConfig(max_new_tokens=30)
    full = autoregressive_generate(ModelAdapter(target), PROMPT, cfg).output_ids
    stop = StopAfter(3)
    with pytest.raises(KeyboardInterrupt) as info:  # still a KeyboardInterrupt for callers that only know that one
        if method == "autoregressive":
            autoregressive_generate(ModelAdapter(target), PROMPT, cfg, on_tokens=stop)
        else:
            dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), make_builder(method, budget=8))
            dec.generate(PROMPT, cfg, on_tokens=stop)
    assert isinstance(info.value, GenerationInterrupted)
    result = info.value.result
    assert result.stop_reason == "interrupted" and result.output_ids == stop.seen
    assert 3 <= len(result.output_ids) < 30 and result.output_ids == full[: len(result.output_ids)]
    assert len(result.steps) == 2  # the third step was interrupted in its callback, after committing its tokens
    assert result.wall_time > 0


@pytest.mark.slow  # a CLI subprocess
def test_ctrl_c_in_the_cli_prints_what_was_generated():
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-c", "from arborspec.cli import app; app()", "generate",
           "Write a very long story about a lighthouse keeper.", "-n", "2000", "--method", "dyspec"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            preexec_fn=sigint_as_at_a_terminal, cwd=Path(__file__).resolve().parents[1])
    os.set_blocking(proc.stdout.fileno(), False)
    text = b""

    def words_streamed() -> bool:
        nonlocal text
        assert proc.poll() is None, proc.stderr.read().decode()
        text += proc.stdout.read() or b""
        return len(text.split()) >= 5

    wait_until(words_streamed, 240, lambda: f"5 streamed words (got {text.decode(errors='replace')!r})")
    assert proc.poll() is None, proc.stderr.read().decode()
    proc.send_signal(signal.SIGINT)
    out, errs = proc.communicate(timeout=180)  # the step in flight finishes first (slow on a loaded machine)
    errs = errs.decode()
    assert proc.returncode == 130, errs
    assert "(interrupted)" in errs and "tokens in" in errs and "tok/s" in errs, errs
    assert "Traceback" not in errs
