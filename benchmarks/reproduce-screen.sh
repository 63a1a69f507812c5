#!/usr/bin/env bash
# Reproduce the tenth session's figures: the greedy screen (the target's argmax at T = 0 without its full float32
# LM-head row, docs/algorithms.md §7) A/B in one process; the stage-6 draft head (its model card) against the
# previous one; and the int8 target at T = 0 and 0.6 with both (plain decoding gets the screen too). Run from the
# repository root after `make setup`, on an otherwise idle machine (2 cores), ~40 min. STEPS="1" runs one step.
source "$(dirname "$0")/reproduce-common.sh"
STEPS=${STEPS:-"0 1 2 3 4 5"}

# 0. Held-out quality and cost of the shipped (stage-6) head as CPU pairs run it: layer and draft logits in int8.
if run 0; then
  $P -m arborspec.offline.head_quality --threads 2 --n-mtbench $MT --n-humaneval 10 --max-new-tokens $N \
    --work-dir runs/head/heldout --int8-logits --int8-layers --out $OUT/head-quality-s10.json
fi

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

# 3. The stage-6 head against the stage-5 head (the previous shipped one, from git), interleaved per prompt in one
#    process: DySpec 8, int8 target, T = 0, outputs checked identical to plain decoding.
if run 3; then
  OLD=runs/head5-shipped
  mkdir -p $OLD
  git show 63d8f4e:src/arborspec/assets/smollm2-head/head.safetensors > $OLD/head.safetensors
  git show 63d8f4e:src/arborspec/assets/smollm2-head/head.json > $OLD/head.json
  $P benchmarks/head_precision_ab.py --dtype int8 --temperature 0 --num-prompts $MT --max-new-tokens $N \
    --versions $OLD src/arborspec/assets/smollm2-head --out $OUT/head-version-ab-t0.json
fi

# 4. The int8 target, T = 0.6 (seed 0): DySpec and OPT-Tree at budget 8 and auto.
if run 4; then
  rm -rf $OUT/int8-head-mtbench-t06-s10
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0.6 --threads 2 \
    --out $OUT/int8-head-mtbench-t06-s10 -m dyspec:budget=8 -m dyspec:budget=auto -m opt-tree:budget=8 \
    -m opt-tree:budget=auto
fi

# 5. Before/after of the whole change with `arborspec bench` (plain int8 decoding interleaved per prompt with DySpec 8,
#    T = 0, 10 x 128): "before" runs ccfd27a's code (no screen, stage-5 head) from a scratch worktree, "after" this code.
if run 5; then
  rm -rf $OUT/screen-before-after /tmp/arborspec-before
  git worktree add -f /tmp/arborspec-before ccfd27a
  PYTHONPATH=/tmp/arborspec-before/src $A bench --dtype int8 --prompts mt-bench --num-prompts ${BA:-10} --max-new-tokens $N \
    --temperatures 0 --threads 2 -m dyspec:budget=8 --out $OUT/screen-before-after/before
  git worktree remove --force /tmp/arborspec-before
  $A bench --dtype int8 --prompts mt-bench --num-prompts ${BA:-10} --max-new-tokens $N --temperatures 0 --threads 2 \
    -m dyspec:budget=8 --out $OUT/screen-before-after/after
fi
