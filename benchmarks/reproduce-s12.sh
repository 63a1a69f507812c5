#!/usr/bin/env bash
# Reproduce the twelfth session's figures: a cross-entropy-weighted fine-tune of the draft head (stage 8) against the
# same fine-tune with the old weight, their held-out quality, the shipped head in use, and the int8 target at T = 0
# and 0.6. Run from the repository root after `make setup`, on an otherwise idle machine (2 cores). Step 1 trains
# (~50 min); steps 2-5 measure (~35 min). STEPS="2" runs one step.
source "$(dirname "$0")/reproduce-common.sh"
STEPS=${STEPS:-"1 2 3 4 5 6 7"}
PREV=03316ad        # the eleventh session's last commit: the stage-7 head
old_head() {        # the stage-7 head, from git
  mkdir -p runs/head7-shipped
  git show $PREV:src/arborspec/assets/smollm2-head/head.safetensors > runs/head7-shipped/head.safetensors
  git show $PREV:src/arborspec/assets/smollm2-head/head.json > runs/head7-shipped/head.json
}

# 1. Stage-8 data (self-instructed, generic openings, seed 3: batches no earlier stage saw), then two fine-tunes of
#    the stage-7 head on it that differ only in the cross-entropy weight (0.1 as every earlier stage, and 1.0),
#    run side by side with one thread each.
if run 1; then
  old_head
  $A train-head --out runs/head8/gen-only --work-dir runs/head8 --self-instruct 16384 --self-instruct-openings \
    --seed 3 --data-time-budget-s 1800 --init-from runs/head7-shipped --epochs 0.01 --lr 5e-4 \
    --train-time-budget-s 5 --threads 2
  # (this session ran the two fine-tunes while the test suite ran; the shipped head is the 1.0 one, exported in
  # float16 by DraftHead.save(..., weights_dtype=torch.float16) into src/arborspec/assets/smollm2-head)
  for W in 0.1 1.0; do   # a work dir each (checkpoints), the same data
    mkdir -p runs/head8-ce$W && ln -sfn ../head8/data-self-instruct runs/head8-ce$W/data-self-instruct
    $A train-head --out runs/head8-ce$W/model --work-dir runs/head8-ce$W --skip-data --init-from runs/head7-shipped \
      --epochs 3 --lr 5e-4 --ce-weight $W --train-time-budget-s 900 --threads 1 --seed 3 \
      > runs/head8-ce$W.log 2>&1 &
  done
  wait
fi

# 2. Held-out quality (MT-Bench 20 first turns, HumanEval 10; layer and draft logits in int8, as CPU pairs run them)
#    of the stage-7 head and of both fine-tunes, on the same held-out answers.
if run 2; then
  old_head
  for H in runs/head7-shipped runs/head8-ce0.1/model runs/head8-ce1.0/model; do   # -> head-quality-s12-<dir>.json
    $P -m arborspec.offline.head_quality --threads 2 --n-mtbench $MT --n-humaneval 10 --max-new-tokens $N \
      --work-dir runs/head/heldout --int8-logits --int8-layers --head $H --out $OUT/head-quality-s12-$(basename ${H%/model}).json
  done
  # the shipped head (stage 8 exported in float16)
  $P -m arborspec.offline.head_quality --threads 2 --n-mtbench $MT --n-humaneval 10 --max-new-tokens $N \
    --work-dir runs/head/heldout --int8-logits --int8-layers --out $OUT/head-quality-s12.json
fi

# 3. The shipped stage-8 head against the stage-7 head (from git), interleaved per prompt in one process: DySpec 8,
#    int8 target, T = 0, outputs checked identical to plain decoding.
if run 3; then
  old_head
  $P benchmarks/head_precision_ab.py --dtype int8 --temperature 0 --num-prompts $MT --max-new-tokens $N \
    --versions runs/head7-shipped src/arborspec/assets/smollm2-head --out $OUT/head-version-ab-t0-s12.json
fi

# 4. The int8 target, T = 0: DySpec and OPT-Tree against plain int8 decoding, with HF generate and assisted
#    generation on the same int8 model.
if run 4; then
  rm -rf $OUT/int8-head-mtbench-t0-s12
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    --compare-hf-assisted --out $OUT/int8-head-mtbench-t0-s12 -m dyspec:budget=8 -m dyspec:budget=16 \
    -m dyspec:budget=auto -m opt-tree:budget=8 -m opt-tree:budget=auto
fi

# 5. The int8 target, T = 0.6 (seed 0): the same tree methods at budgets 8 and auto.
if run 5; then
  rm -rf $OUT/int8-head-mtbench-t06-s12
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0.6 --threads 2 \
    --out $OUT/int8-head-mtbench-t06-s12 -m dyspec:budget=8 -m dyspec:budget=auto -m opt-tree:budget=8 \
    -m opt-tree:budget=auto
fi

# 6. Before/after of the session with `arborspec bench` (plain int8 decoding interleaved per prompt with DySpec 8,
#    T = 0): "before" drafts with the stage-7 head from git, "after" with the shipped stage-8 head. The code paths
#    are the same (this session changed the head's weights and a training option only).
if run 6; then
  old_head
  rm -rf $OUT/s12-before-after
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    -m dyspec:budget=8 --draft runs/head7-shipped --out $OUT/s12-before-after/before
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    -m dyspec:budget=8 --out $OUT/s12-before-after/after
fi

# 7. The head's agreement with the int8 target against the float32 one (each target's own greedy answers and
#    features; 8 MT-Bench first turns).
if run 7; then
  $P benchmarks/head_target_agreement.py --num-prompts 8 --out $OUT/head-target-agreement.json
fi
