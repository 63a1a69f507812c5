#!/usr/bin/env bash
# Before/after of a session's per-step changes: the same draft head, the same prompts, each run interleaved with
# plain decoding in its own process. BEFORE = a checkout of the session's starting commit, e.g.
#   git worktree add /work/wt-before a290101          (fifth session; the third session's was 783856c)
# Run from the repository root on an idle machine (~6 min). OUT: where the two result folders go; METHODS, TEMPS and
# EXTRA (e.g. "--dtype int8") change what is compared (default: the two budget-16 builders at T = 0, float32).
set -euo pipefail
BEFORE=${BEFORE:-/work/wt-before}
OUT=${OUT:-benchmarks/before-after}
HEAD_DIR=${HEAD_DIR:-src/arborspec/assets/smollm2-head}
METHODS=${METHODS:-"-m dyspec:budget=16 -m opt-tree:budget=16"}
ARGS="bench --prompts mt-bench --num-prompts 10 --max-new-tokens 64 --temperatures ${TEMPS:-0} --threads 2
      --draft $PWD/$HEAD_DIR $METHODS ${EXTRA:-}"
rm -rf $OUT
PYTHONPATH=$BEFORE/src .venv/bin/python -c "from arborspec.cli import app; app()" $ARGS --out $OUT/before
.venv/bin/python -c "from arborspec.cli import app; app()" $ARGS --out $OUT/after
