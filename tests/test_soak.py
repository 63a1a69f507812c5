"""The randomized soak (offline/soak.py): a short run passes every check, and a broken engine is caught
with a case seed and step that reproduce the failure."""

from arborspec.engine.adapter import ModelAdapter
from arborspec.offline.soak import draw_case, soak


def test_short_soak_has_no_failures():
    report = soak(150, seed=0, progress=False)
    assert report.steps >= 150 and report.cases >= 5 and report.tokens > 0
    assert report.failures == [], report.failures


def test_a_broken_compaction_is_caught_and_replayable(monkeypatch):
    monkeypatch.setattr(ModelAdapter, "compact", lambda self, start, slots: None)  # keeps every tree row
    report = soak(60, seed=3, progress=False)
    assert report.failures, "a cache that is never compacted must fail the soak"
    first = report.failures[0]
    assert first.step >= 1 and "cache" in first.message and first.description
    replayed = soak(1, replay=first.case_seed, progress=False)
    assert replayed.cases == 1 and [(f.case_seed, f.step, f.message) for f in replayed.failures] == \
        [(first.case_seed, first.step, first.message)]


def test_cases_are_drawn_from_their_seed_alone():
    assert draw_case(12345) == draw_case(12345) and draw_case(12345) != draw_case(54321)
