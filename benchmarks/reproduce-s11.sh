#!/usr/bin/env bash
# Reproduce the eleventh session's figures: the float64 KV cache
# of the int8 target, the stage-7 draft head, budget=auto with its robust overhead fit and its temperature-0 cost
# curve, and the int8 target at T = 0 and 0.6 with all of it. Run from the repository root after `make setup`, on an
# otherwise idle machine (2 cores), ~45 min. STEPS="1" runs one step.
source "$(dirname "$0")/reproduce-common.sh"
STEPS=${STEPS:-"0 2 3 4 5 6 7 8"}
PREV=f8ff913        # the tenth session's last commit: the stage-6 head, transformers' cache

# 0. Held-out quality and cost of the shipped head as CPU pairs run it (layer and draft logits in int8), and of the
#    stage-6 head on the same held-out answers.
if run 0; then
  OLD=runs/head6-shipped
  mkdir -p $OLD
  git show $PREV:src/arborspec/assets/smollm2-head/head.safetensors > $OLD/head.safetensors
  git show $PREV:src/arborspec/assets/smollm2-head/head.json > $OLD/head.json
  $P -m arborspec.offline.head_quality --threads 2 --n-mtbench $MT --n-humaneval 10 --max-new-tokens $N \
    --work-dir runs/head/heldout --int8-logits --int8-layers --out $OUT/head-quality-s11.json
  $P -m arborspec.offline.head_quality --threads 2 --n-mtbench $MT --n-humaneval 10 --max-new-tokens $N \
    --work-dir runs/head/heldout --int8-logits --int8-layers --head $OLD --out $OUT/head-quality-s11-stage6.json
fi

# 1. (Screening the greedy verifier's likely rows ahead in one pass: measured 1.003x at 66832d1 with
#    `greedy_screen_ab.py --ahead 3`, and removed again.)

# 2. The float64 KV cache against transformers' float32 cache: single tree forwards at 250 and 1,200 cached tokens,
#    then whole generations (plain int8 decoding and DySpec 8), interleaved in one process.
if run 2; then
  $P benchmarks/kv_cache_ab.py --forwards --out $OUT/kv-cache-forwards-int8.json
  $P benchmarks/kv_cache_ab.py --num-prompts $MT --max-new-tokens $N --out $OUT/kv-cache-ab-int8.json
fi

# 3. The stage-7 head against the stage-6 head (from git), interleaved per prompt in one process: DySpec 8, int8
#    target, T = 0, outputs checked identical to plain decoding.
if run 3; then
  OLD=runs/head6-shipped
  mkdir -p $OLD
  git show $PREV:src/arborspec/assets/smollm2-head/head.safetensors > $OLD/head.safetensors
  git show $PREV:src/arborspec/assets/smollm2-head/head.json > $OLD/head.json
  $P benchmarks/head_precision_ab.py --dtype int8 --temperature 0 --num-prompts $MT --max-new-tokens $N \
    --versions $OLD src/arborspec/assets/smollm2-head --out $OUT/head-version-ab-t0-s11.json
fi

# 4. The int8 target, T = 0: DySpec and OPT-Tree at budgets 8, 16 and auto against plain int8 decoding, with HF
#    generate and assisted generation on the same int8 model.
if run 4; then
  rm -rf $OUT/int8-head-mtbench-t0-s11
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    --compare-hf-assisted --out $OUT/int8-head-mtbench-t0-s11 -m dyspec:budget=8 -m dyspec:budget=16 \
    -m dyspec:budget=auto -m opt-tree:budget=8 -m opt-tree:budget=16 -m opt-tree:budget=auto
fi

# 5. The int8 target, T = 0.6 (seed 0): the same tree methods.
if run 5; then
  rm -rf $OUT/int8-head-mtbench-t06-s11
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0.6 --threads 2 \
    --out $OUT/int8-head-mtbench-t06-s11 -m dyspec:budget=8 -m dyspec:budget=16 -m dyspec:budget=auto \
    -m opt-tree:budget=8 -m opt-tree:budget=16 -m opt-tree:budget=auto
fi

# 6. Before/after of the session with `arborspec bench` (plain int8 decoding interleaved per prompt with DySpec 8,
#    T = 0): "before" runs the tenth session's code from a scratch worktree, "after" this code.
if run 6; then
  rm -rf $OUT/s11-before-after /tmp/arborspec-before
  git worktree add -f /tmp/arborspec-before $PREV
  PYTHONPATH=/tmp/arborspec-before/src $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N \
    --temperatures 0 --threads 2 -m dyspec:budget=8 --out $OUT/s11-before-after/before
  git worktree remove --force /tmp/arborspec-before
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    -m dyspec:budget=8 --out $OUT/s11-before-after/after
fi

# 7. A repeat of step 4's tree methods at budgets 8 and auto (how far two runs of the same code lie apart here).
if run 7; then
  rm -rf $OUT/int8-head-mtbench-t0-s11-repeat
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    --out $OUT/int8-head-mtbench-t0-s11-repeat -m dyspec:budget=8 -m dyspec:budget=auto -m opt-tree:budget=8 \
    -m opt-tree:budget=auto
fi

# 8. Before/after at T = 0.6 (DySpec 8 and auto), as step 6.
if run 8; then
  rm -rf $OUT/s11-before-after-t06 /tmp/arborspec-before
  git worktree add -f /tmp/arborspec-before $PREV
  PYTHONPATH=/tmp/arborspec-before/src $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N \
    --temperatures 0.6 --threads 2 -m dyspec:budget=8 -m dyspec:budget=auto --out $OUT/s11-before-after-t06/before
  git worktree remove --force /tmp/arborspec-before
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0.6 --threads 2 \
    -m dyspec:budget=8 -m dyspec:budget=auto --out $OUT/s11-before-after-t06/after
fi

# The stage-7 data's overlap with the benchmark prompts (runs/head7 from the model card's stage-7 command):
#   .venv/bin/python -m arborspec.offline.prompt_overlap --data-dir runs/head7/data-self-instruct \
#     --out benchmarks/self-instruct-overlap-s11.json
