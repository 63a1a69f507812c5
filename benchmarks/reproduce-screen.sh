#!/usr/bin/env bash
# Reproduce the tenth session's figures: the greedy screen (the target's argmax at T = 0 without its full float32
# LM-head row, docs/algorithms.md §7) A/B in one process, and the int8 target at T = 0 with it (plain decoding gets
# it too). Run from the repository root after `make setup`, on an otherwise idle machine (2 cores), ~20 min.
# STEPS="1" runs one step.
set -euo pipefail
A=.venv/bin/arborspec
P=.venv/bin/python
OUT=benchmarks
MT=${MT:-20}        # MT-Bench first turns
N=${N:-128}         # new tokens per generation
STEPS=${STEPS:-"1 2"}
run() { [[ " $STEPS " == *" $1 "* ]]; }

# 1. The screen off (every greedy token from the full float32 row) and on, interleaved per prompt in one process:
#    plain int8 decoding and DySpec 8 with the draft head, outputs checked identical.
if run 1; then
  $P benchmarks/greedy_screen_ab.py --dtype int8 --num-prompts ${AB:-10} --max-new-tokens $N \
    --out $OUT/greedy-screen-ab-int8.json
fi

# 2. The int8 target, T = 0, with the screen: DySpec and OPT-Tree at budget 8 and auto against plain int8 decoding,
#    with HF generate and assisted generation on the same int8 model.
if run 2; then
  rm -rf $OUT/int8-head-mtbench-t0-s10
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    --compare-hf-assisted --out $OUT/int8-head-mtbench-t0-s10 -m dyspec:budget=8 -m dyspec:budget=auto \
    -m opt-tree:budget=8 -m opt-tree:budget=auto
fi
