"""The training tools' shared parts: the learning-rate schedule, length batches, atomic writes,
the deferred Ctrl-C, checkpoints that resume exactly, and a distillation cut by SIGINT that
resumes to the uninterrupted weights."""

from __future__ import annotations

import random
import shutil
import signal

import pytest
import torch
from arborspec.common.atomic import write_atomic
from arborspec.common.interrupts import DeferredInterrupt
from arborspec.errors import Interrupted
from arborspec.offline.batching import length_batches, token_batches
from arborspec.offline.training import TrainingRun, WarmupCosine, has_checkpoint, held_out_split

from conftest import char_tokenizer, tiny_llama


def test_warmup_cosine_exact_rates():
    s = WarmupCosine(lr=1.0, warmup_steps=2, min_ratio=0.05)
    assert [s.at(step, 10) for step in (0, 1, 2)] == [0.5, 1.0, 1.0]
    assert s.at(6, 10) == pytest.approx(0.525, abs=1e-15)   # half-way through the decay
    assert s.at(10, 10) == pytest.approx(0.05, abs=1e-15)   # the floor
    assert s.at(2, 10, time_fraction=0.5) == pytest.approx(0.525, abs=1e-15)  # budget further on
    assert s.at(2, 10, time_fraction=3.0) == pytest.approx(0.05, abs=1e-15)   # past the budget
    assert s.at(8, 10, time_fraction=0.1) == s.at(8, 10)    # the steps are further on


def test_length_batches_group_similar_lengths_in_a_seeded_order():
    lengths = [5, 1, 3, 1, 4, 9, 2]
    # by length: 1 (1), 3 (1), 6 (2), 2 (3), 4 (4), 0 (5), 5 (9); cut in twos; the order shuffled
    assert length_batches(lengths, 2, random.Random(0)) == [[4, 0], [1, 3], [6, 2], [5]]
    # as many as keep rows x longest within 10 tokens: 3 x 3, then 5, 10 and 12 alone
    assert token_batches([3, 3, 3, 5, 10, 12], 10, random.Random(0)) == [[4], [0, 1, 2], [3], [5]]
    train, held = held_out_split(list("abcdef"), 2, random.Random(1))
    assert sorted(train + held) == list("abcdef") and len(held) == 2
    assert (train, held) == held_out_split(list("abcdef"), 2, random.Random(1))


def test_an_atomic_write_cut_short_leaves_the_old_file(tmp_path):
    path = tmp_path / "sub" / "file.txt"
    write_atomic(path, lambda tmp: tmp.write_text("old"))

    def broken(tmp):
        tmp.write_text("half")
        raise RuntimeError("cut short")

    with pytest.raises(RuntimeError):
        write_atomic(path, broken)
    assert path.read_text() == "old"
    write_atomic(path, lambda tmp: tmp.write_text("new"))
    assert path.read_text() == "new" and not (tmp_path / "sub" / "file.txt.tmp").exists()


def test_the_first_ctrl_c_is_deferred_and_the_second_aborts():
    before = signal.getsignal(signal.SIGINT)
    with DeferredInterrupt(notice="") as guard:
        assert not guard.requested
        signal.raise_signal(signal.SIGINT)
        assert guard.requested
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def _steps(model, opt, n, seed):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x = torch.randn(4, 3, generator=gen)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_a_resumed_run_continues_from_the_checkpoint_exactly(tmp_path):
    def fresh():
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        return model, torch.optim.AdamW(model.parameters(), lr=0.1)

    model, opt = fresh()
    run = TrainingRun(model, opt, tmp_path, resume=True, extra={"epoch": 0})
    assert not run.resumed and not has_checkpoint(tmp_path)
    _steps(model, opt, 3, seed=1)
    run.state.update(step=3, epoch=1)
    assert run.record({"loss": 2.0}, 2.0, higher_is_better=False)
    assert not run.record({"loss": 2.5}, 2.5, higher_is_better=False)
    assert run.record({"loss": 2.0, "tie": True}, 2.0, higher_is_better=False)  # a tie is best
    run.save()
    _steps(model, opt, 2, seed=2)

    again, opt2 = fresh()
    resumed = TrainingRun(again, opt2, tmp_path, resume=True)
    assert resumed.resumed and resumed.state["step"] == 3 and resumed.state["epoch"] == 1
    assert resumed.state["best"] == {"loss": 2.0, "tie": True}
    assert len(resumed.state["history"]) == 3
    _steps(again, opt2, 2, seed=2)
    for a, b in zip(model.parameters(), again.parameters()):
        assert torch.equal(a, b)
    assert not TrainingRun(*fresh(), tmp_path, resume=False).resumed  # no resume: starts over


def test_distillation_cut_by_sigint_resumes_to_the_uninterrupted_weights(tmp_path, monkeypatch):
    from arborspec.offline import distill as module
    from arborspec.offline.distill import DistillConfig, distill

    target = tmp_path / "target"
    tiny_llama(0).save_pretrained(target)
    char_tokenizer().save_pretrained(target)
    settings = dict(target=str(target), layers=1, hidden=16, intermediate=32, heads=2, kv_heads=1,
                    num_prompts=8, max_new_tokens=6, gen_batch_size=4, topk=8, train_steps=8,
                    warmup_steps=2, batch_size=2, ckpt_every=3, lr=1e-2, seed=1)
    whole = DistillConfig(out_dir=str(tmp_path / "a"), stages="data,train", **settings)
    distill(whole, progress=False)
    shutil.copytree(whole.work_path / "data", tmp_path / "b.work" / "data")

    real, calls = module._loss, []

    def sigint_in_step_four(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:  # steps 1-3, the held-out evaluation at step 3 (one batch), step 4
            signal.raise_signal(signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "_loss", sigint_in_step_four)
    cut = DistillConfig(out_dir=str(tmp_path / "b"), stages="train", **settings)
    with pytest.raises(Interrupted, match="rerun with --resume"):
        distill(cut, progress=False)
    monkeypatch.setattr(module, "_loss", real)
    ckpt = cut.work_path / "checkpoint" / "ckpt.pt"
    assert torch.load(ckpt, weights_only=True)["state"]["step"] == 4
    resumed = DistillConfig(out_dir=str(tmp_path / "b"), stages="train", resume=True, **settings)
    distill(resumed, progress=False)
    a = torch.load(whole.work_path / "checkpoint" / "ckpt.pt", weights_only=True)
    b = torch.load(ckpt, weights_only=True)
    assert a["state"]["step"] == b["state"]["step"] == 8
    for name, weight in a["model"].items():
        assert torch.equal(weight, b["model"][name]), name
