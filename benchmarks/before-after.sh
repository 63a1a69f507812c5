#!/usr/bin/env bash
# Before/after of this session's per-step changes (LM head on demand, compaction to the committed path, online
# acceptance statistics, step timing): the same shipped draft head, the same prompts, each run interleaved with
# plain decoding in its own process. BEFORE = a checkout of the session's starting commit (783856c), e.g.
#   git worktree add /work/wt-before 783856c
# Run from the repository root on an idle machine (~6 min).
set -euo pipefail
BEFORE=${BEFORE:-/work/wt-before}
HEAD_DIR=src/arborspec/assets/smollm2-head
ARGS="bench --prompts mt-bench --num-prompts 10 --max-new-tokens 64 --temperatures 0 --threads 2
      --draft $PWD/$HEAD_DIR -m dyspec:budget=16 -m opt-tree:budget=16"
rm -rf benchmarks/before-after
PYTHONPATH=$BEFORE/src .venv/bin/python -c "from arborspec.cli import app; app()" $ARGS --out benchmarks/before-after/before
.venv/bin/python -c "from arborspec.cli import app; app()" $ARGS --out benchmarks/before-after/after
