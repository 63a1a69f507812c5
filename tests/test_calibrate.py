"""Sequoia calibration on the tiny pair: acceptance vector, costs, the JSON file and its validation, resume."""

from __future__ import annotations

import json

import pytest
import torch
from arborspec.builders.registry import make_builder
from arborspec.builders.sequoia_dp import tree_score
from arborspec.builders.shapes import load_shape
from arborspec.drafters import ModelDrafter
from arborspec.engine.sampling import SamplingConfig
from arborspec.errors import ArborError
from arborspec.offline.calibrate import (
    CalibrationConfig,
    CalibrationProgress,
    accepted_child_index,
    calibrate_models,
    load_calibration,
    write_sequoia_shape,
)

SMALL = dict(children=6, draws=6, max_new_tokens=12, max_tree_tokens=16, timing_context=32, timing_repeats=2)


def prompts(n: int = 3, length: int = 8, vocab: int = 96) -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    return torch.randint(3, vocab, (n, length), generator=gen).tolist()


@pytest.fixture(scope="module")
def tiny_calibration(tiny_pair, tmp_path_factory):
    target, draft = tiny_pair
    cfg = CalibrationConfig(temperature=1.0, **SMALL)
    cal = calibrate_models(target, ModelDrafter(draft), prompts(), cfg, target_name="tiny-t", draft_name="tiny-d",
                           progress=False)
    path = tmp_path_factory.mktemp("cal") / "cal.json"
    cal.save(path)
    return cal, path


def test_calibration_file_is_valid(tiny_calibration):
    cal, path = tiny_calibration
    data = json.loads(path.read_text())
    for key in ["target", "draft", "vocab_size", "sampling", "acceptance", "time_tokens", "time_relative",
                "draft_cost", "machine", "created"]:
        assert key in data
    assert data["machine"]["torch"] == torch.__version__ and data["vocab_size"] == 96
    loaded = load_calibration(path, target="tiny-t", draft="tiny-d")
    assert loaded.acceptance == cal.acceptance
    assert loaded.positions == 3 * 13 and loaded.trials == loaded.positions * 6


def test_acceptance_vector_is_sane(tiny_calibration):
    cal, _ = tiny_calibration
    p = cal.acceptance
    assert len(p) == 6 and all(0 <= x <= 1 for x in p) and sum(p) <= 1 + 1e-9
    assert p[0] > 0.15  # the perturbed copy agrees with the (near-uniform, random) target fairly often
    assert p[0] > max(p[1:]) and p[0] + p[1] > sum(p[3:])  # decreasing-ish: early children take most mass


def test_costs_are_sane(tiny_calibration):
    cal, _ = tiny_calibration
    assert cal.time_tokens == [1, 2, 4, 8, 16] and cal.time_relative[0] == 1.0
    assert all(x > 0 for x in cal.time_relative) and cal.draft_cost > 0 and cal.time_one_token_s > 0
    assert cal.t(3) == pytest.approx((cal.time_relative[1] + cal.time_relative[2]) / 2)


def test_load_validation_errors(tiny_calibration, tmp_path):
    _, path = tiny_calibration
    with pytest.raises(ArborError, match="measured for target 'tiny-t', not 'embedded'"):
        load_calibration(path, target="embedded")
    with pytest.raises(ArborError, match="draft"):
        load_calibration(path, target="tiny-t", draft="other")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ArborError, match="not valid JSON"):
        load_calibration(bad)
    bad.write_text(json.dumps({"shape": [[0]]}))
    with pytest.raises(ArborError, match="not an arborspec calibration"):
        load_calibration(bad)
    data = json.loads(path.read_text())
    data["acceptance"] = [0.9, 0.9]
    bad.write_text(json.dumps(data))
    with pytest.raises(ArborError, match="acceptance"):
        load_calibration(bad)
    with pytest.raises(ArborError, match="does not exist"):
        load_calibration(tmp_path / "missing.json")


def test_shape_from_calibration(tiny_calibration, tmp_path):
    cal, path = tiny_calibration
    shape, meta = write_sequoia_shape(path, tmp_path / "s.json", size=10, depth=4)
    loaded, saved = load_shape(tmp_path / "s.json")
    assert len(loaded) == 10 and max(map(len, loaded)) <= 4
    assert saved["expected_accepted_length"] == pytest.approx(tree_score(loaded, cal.acceptance))
    builder = make_builder("sequoia", shape=str(tmp_path / "s.json"))  # the run-time builder reads it
    assert builder.budget == 10 and builder.max_depth <= 4
    shape, meta = write_sequoia_shape(cal, tmp_path / "auto.json", max_size=16, max_depth=5)
    assert meta["choice"] == "hardware-aware" and 1 <= meta["size"] <= 16 and meta["predicted_speedup"] > 0


def test_draft_equal_to_target_accepts_first_child(tiny_pair):
    target, _ = tiny_pair
    cfg = CalibrationConfig(temperature=1.0, **{**SMALL, "max_new_tokens": 6, "draws": 3})
    cal = calibrate_models(target, ModelDrafter(target), prompts(2), cfg, target_name="t", draft_name="t",
                           progress=False)
    assert cal.acceptance[0] >= 0.99 and sum(cal.acceptance[1:]) <= 0.01


def test_greedy_acceptance_is_argmax_match():
    # At temperature 0 the target is one-hot: the accepted child is the argmax, wherever it was drawn.
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([0.0, 3.0, 1.0, 0.5])
    draft = torch.tensor([0.4, 0.1, 0.3, 0.2])
    for _ in range(20):
        k = accepted_child_index(logits, draft, 4, SamplingConfig(0.0), gen)
        assert k is not None  # all 4 tokens are children, so the argmax is among them
    # one child, forced by a one-hot draft: accepted exactly when it is the argmax (token 1)
    for token, expected in ((1, 0), (2, None), (0, None)):
        only = torch.nn.functional.one_hot(torch.tensor(token), 4).float()
        assert accepted_child_index(logits, only, 1, SamplingConfig(0.0), gen) == expected


def test_ordered_draws_accept_at_the_argmax_rank_of_the_draft():
    # ordered draws (temperature 0's default): children are the draft's tokens by probability, so the target's
    # argmax (token 1) is accepted as the child of its draft rank, every time
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([0.0, 3.0, 1.0, 0.5])
    draft = torch.tensor([0.4, 0.1, 0.3, 0.2])  # token 1 is the draft's 4th most likely
    assert {accepted_child_index(logits, draft, 4, SamplingConfig(0.0), gen, ordered=True) for _ in range(10)} == {3}
    assert accepted_child_index(logits, draft, 3, SamplingConfig(0.0), gen, ordered=True) is None


def test_interrupted_calibration_resumes_to_the_uninterrupted_result(tiny_pair, tiny_calibration, tmp_path,
                                                                     monkeypatch):
    from arborspec.offline import calibrate as module

    target, draft = tiny_pair
    partial = tmp_path / "cal.json.partial"

    def run(cfg=None, ids=None, **kw):
        cfg = cfg or CalibrationConfig(temperature=1.0, **SMALL)
        return calibrate_models(target, ModelDrafter(draft), prompts() if ids is None else ids, cfg,
                                target_name="tiny-t", draft_name="tiny-d", progress=False,
                                progress_file=partial, **kw)

    real, calls = module.target_logits_along, []

    def ctrl_c_on_third_prompt(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "target_logits_along", ctrl_c_on_third_prompt)
    with pytest.raises(KeyboardInterrupt):
        run()
    saved = CalibrationProgress.load(partial)  # written after each finished prompt
    assert saved.tally.prompts_done == 2 and saved.timing is None and saved.tally.trials == saved.tally.positions * 6
    monkeypatch.setattr(module, "target_logits_along", real)
    with pytest.raises(ArborError, match="unfinished calibration: pass --resume"):
        run()
    with pytest.raises(ArborError, match="draws=6, not 5"):
        run(CalibrationConfig(temperature=1.0, **{**SMALL, "draws": 5}), resume=True)
    with pytest.raises(ArborError, match="prompts="):
        run(ids=prompts(4), resume=True)
    cal = run(resume=True)
    ref = tiny_calibration[0]  # the same calibration, never interrupted: same random draws, same histogram
    assert (cal.acceptance, cal.positions, cal.trials) == (ref.acceptance, ref.positions, ref.trials)
    assert CalibrationProgress.load(partial).timing is not None  # kept until the caller saved the result


def test_calibration_progress_and_result_go_into_a_new_folder(tiny_pair, tmp_path):
    """`arborspec calibrate --out NEW/DIR/cal.json`: the progress file after the first prompt and the result are
    written into folders that do not exist yet (it raised FileNotFoundError after the first prompt)."""
    target, draft = tiny_pair
    folder = tmp_path / "new" / "folder"
    cal = calibrate_models(target, ModelDrafter(draft), prompts(2), CalibrationConfig(temperature=1.0, **SMALL),
                           target_name="tiny-t", draft_name="tiny-d", progress=False,
                           progress_file=folder / "cal.json.partial")
    assert (folder / "cal.json.partial").is_file()
    cal.save(tmp_path / "other" / "cal.json")
    assert (tmp_path / "other" / "cal.json").is_file()
