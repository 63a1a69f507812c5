#!/usr/bin/env bash
# Reproduce the thirteenth session's figures: a ninth head stage (fresh self-instructed data, then fine-tunes of the
# stage-8 head on the stage-8 and stage-9 data with two cross-entropy weights), EAGLE-3's fused features probed,
# the session's two step-cost changes A/B, and the int8 target at T = 0 and 0.6 with the shipped head, with and
# without context lookup. Run from the
# repository root after `make setup`, on an otherwise idle machine (2 cores). Step 1 generates and trains (~90 min,
# it needs runs/head8/data-self-instruct from reproduce-s12.sh step 1); steps 2-8 measure (~60 min).
# STEPS="2" runs one step.
source "$(dirname "$0")/reproduce-common.sh"
STEPS=${STEPS:-"1 2 3 4 5 6 7 8"}
PREV=1312431        # the twelfth session's last commit: the stage-8 head
old_head() {        # the stage-8 head, from git
  mkdir -p runs/head8-shipped
  git show $PREV:src/arborspec/assets/smollm2-head/head.safetensors > runs/head8-shipped/head.safetensors
  git show $PREV:src/arborspec/assets/smollm2-head/head.json > runs/head8-shipped/head.json
}

# 1. Stage-9 data (self-instructed with generic openings, seed 4: batches no earlier stage saw, 60 min), then two
#    fine-tunes of the stage-8 head on the stage-8 and stage-9 data together that differ only in the cross-entropy
#    weight (1.0 as stage 8, and 3.0), side by side with one thread each, 25 min each.
if run 1; then
  old_head
  $A train-head --out runs/head9/gen-only --work-dir runs/head9 --self-instruct 16384 --self-instruct-openings \
    --seed 4 --data-time-budget-s 3600 --init-from runs/head8-shipped --epochs 0.01 --lr 5e-4 \
    --train-time-budget-s 5 --threads 2
  mkdir -p runs/head9-data/data-self-instruct   # both stages' shards, renamed apart
  for f in runs/head8/data-self-instruct/shard_*.safetensors; do
    ln -sfn ../../head8/data-self-instruct/$(basename $f) runs/head9-data/data-self-instruct/shard_0$(basename $f | cut -c7-)
  done
  for f in runs/head9/data-self-instruct/shard_*.safetensors; do
    ln -sfn ../../head9/data-self-instruct/$(basename $f) runs/head9-data/data-self-instruct/shard_1$(basename $f | cut -c7-)
  done
  for W in 1.0 3.0; do   # a work dir each (checkpoints), the same data
    mkdir -p runs/head9-ce$W && ln -sfn ../head9-data/data-self-instruct runs/head9-ce$W/data-self-instruct
    $A train-head --out runs/head9-ce$W/model --work-dir runs/head9-ce$W --skip-data --init-from runs/head8-shipped \
      --epochs 3 --lr 5e-4 --ce-weight $W --train-time-budget-s 1500 --threads 1 --seed 4 \
      > runs/head9-ce$W.log 2>&1 &
  done
  wait
fi

# 2. Held-out quality (MT-Bench 20 first turns, HumanEval 10; layer and draft logits in int8, as CPU pairs run them)
#    of the stage-8 head and of both fine-tunes, on the same held-out answers; then the shipped head.
if run 2; then
  old_head
  for H in runs/head8-shipped runs/head9-ce1.0/model runs/head9-ce3.0/model; do   # -> head-quality-s13-<dir>.json
    $P -m arborspec.offline.head_quality --threads 2 --n-mtbench $MT --n-humaneval 10 --max-new-tokens $N \
      --work-dir runs/head/heldout --int8-logits --int8-layers --head $H --out $OUT/head-quality-s13-$(basename ${H%/model}).json
  done
  $P -m arborspec.offline.head_quality --threads 2 --n-mtbench $MT --n-humaneval 10 --max-new-tokens $N \
    --work-dir runs/head/heldout --int8-logits --int8-layers --out $OUT/head-quality-s13.json
fi

# 3. EAGLE-3's fused features against the top feature alone: both arms fine-tune the stage-8 head for the same
#    steps on 372 stage-9 sequences (features recomputed by a teacher-forced pass), held-out top-1 at depth 1.
#    Quality only; this session ran it beside step 1's data generation.
if run 3; then
  old_head
  $P benchmarks/fused_features_probe.py --data runs/head9/data-self-instruct --sequences 372 \
    --init-from runs/head8-shipped --lr 5e-4 --steps 400 --threads 1 --out $OUT/fused-features-probe.json
fi

# 4. The session's two step-cost changes against the paths they replaced, interleaved per prompt in one process
#    (DySpec 8, int8 target, T = 0, shipped head): the head's body forward and one screened row per read, the
#    head's direct layer call alone, and both with the root's likeliest path screened together. Neither gained, so
#    both were reverted (99717da); the script and the code it measures live at 5ac993b, run from a worktree.
if run 4; then
  WT=$(mktemp -d)/arborspec-5ac993b
  git worktree add --detach "$WT" 5ac993b
  cp src/arborspec/assets/smollm2-head/head.* "$WT/src/arborspec/assets/smollm2-head/"   # the stage-9 head, as run
  PYTHONPATH="$WT/src" $P "$WT/benchmarks/step_paths_ab.py" --num-prompts $MT --max-new-tokens $N \
    --out $OUT/step-paths-ab-s13.json
  git worktree remove --force "$WT"
fi

# 5. The shipped stage-9 head against the stage-8 head (from git), interleaved per prompt in one process.
if run 5; then
  old_head
  $P benchmarks/head_precision_ab.py --dtype int8 --temperature 0 --num-prompts $MT --max-new-tokens $N \
    --versions runs/head8-shipped src/arborspec/assets/smollm2-head --out $OUT/head-version-ab-t0-s13.json
fi

# 6. The int8 target, T = 0, MT-Bench: DySpec and OPT-Tree against plain int8 decoding, with and without context
#    lookup (6 tokens), with HF generate and assisted generation on the same int8 model; then 10 HumanEval prompts.
if run 6; then
  rm -rf $OUT/int8-head-mtbench-t0-s13 $OUT/int8-head-humaneval-t0-s13
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    --compare-hf-assisted --out $OUT/int8-head-mtbench-t0-s13 -m dyspec:budget=8 -m dyspec:budget=8:lookup=6 \
    -m dyspec:budget=16 -m dyspec:budget=auto -m opt-tree:budget=8 -m opt-tree:budget=8:lookup=6
  $A bench --dtype int8 --prompts humaneval --num-prompts 10 --max-new-tokens $N --temperatures 0 --threads 2 \
    --compare-hf-assisted --out $OUT/int8-head-humaneval-t0-s13 -m dyspec:budget=8 -m dyspec:budget=8:lookup=6
  rm -rf $OUT/int8-head-mtbench-t0-s13-auto   # a repeat, with budget=auto and lookup
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    --out $OUT/int8-head-mtbench-t0-s13-auto -m dyspec:budget=auto:lookup=6 -m dyspec:budget=8:lookup=6 -m dyspec:budget=auto
fi

# 7. The int8 target, T = 0.6 (seed 0), MT-Bench: the tree methods at budgets 8 and auto; OPT-Tree (verified by
#    sample-and-match) with lookup too (DySpec's rejection verifier takes no grafted nodes).
if run 7; then
  rm -rf $OUT/int8-head-mtbench-t06-s13
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0.6 --threads 2 \
    --out $OUT/int8-head-mtbench-t06-s13 -m dyspec:budget=8 -m dyspec:budget=auto -m opt-tree:budget=8 \
    -m opt-tree:budget=8:lookup=6 -m opt-tree:budget=auto
fi

# 8. The demo line of the README.
if run 8; then
  make demo
fi
