#!/usr/bin/env bash
# Reproduce the fourteenth session's figures: a tenth head stage (fresh self-instructed data, then two fine-tunes of
# the stage-9 head on the stage-8, 9 and 10 data that differ only in the draft vocabulary, 8,192 or 12,288 tokens),
# its held-out quality and speed against stage 9, and the int8 target at T = 0 and 0.6 with it. Run from the
# repository root after `make setup`, on an otherwise idle machine (2 cores). Step 1 generates and trains (~100 min;
# it needs runs/head8/data-self-instruct and runs/head9/data-self-instruct from reproduce-s12.sh and
# reproduce-s13.sh step 1); steps 2-5 measure (~60 min). STEPS="2" runs one step.
source "$(dirname "$0")/reproduce-common.sh"
STEPS=${STEPS:-"1 2 3 4 5"}
PREV=384dcdf        # the thirteenth session's last commit: the stage-9 head
old_head() {        # the stage-9 head, from git
  mkdir -p runs/head9-shipped
  git show $PREV:src/arborspec/assets/smollm2-head/head.safetensors > runs/head9-shipped/head.safetensors
  git show $PREV:src/arborspec/assets/smollm2-head/head.json > runs/head9-shipped/head.json
}

# 1. Stage-10 data (self-instructed with generic openings, seed 5: batches no earlier stage saw, 75 min), then two
#    fine-tunes of the stage-9 head on the stage-8, 9 and 10 data together (2 epochs, --ce-weight 3.0 as stage 9)
#    with the draft vocabulary recounted on that data at 8,192 (as before) and 12,288 tokens, side by side with
#    one thread each, 25 min each.
if run 1; then
  old_head
  $A train-head --out runs/head10/gen-only --work-dir runs/head10 --self-instruct 16384 --self-instruct-openings \
    --seed 5 --data-time-budget-s 4500 --init-from runs/head9-shipped --epochs 0.01 --lr 5e-4 \
    --train-time-budget-s 5 --threads 2
  mkdir -p runs/head10-data/data-self-instruct   # the three stages' shards, renamed apart
  for S in 8 9 10; do
    for f in runs/head$S/data-self-instruct/shard_*.safetensors; do
      ln -sfn ../../head$S/data-self-instruct/$(basename $f) \
        runs/head10-data/data-self-instruct/shard_$(printf %02d $S)$(basename $f | cut -c8-)
    done
  done
  for V in 8192 12288; do   # a work dir each (checkpoints), the same data
    mkdir -p runs/head10-v$V && ln -sfn ../head10-data/data-self-instruct runs/head10-v$V/data-self-instruct
    $A train-head --out runs/head10-v$V/model --work-dir runs/head10-v$V --skip-data --init-from runs/head9-shipped \
      --epochs 2 --lr 5e-4 --ce-weight 3.0 --draft-vocab $V --train-time-budget-s 1500 --threads 1 --seed 5 \
      > runs/head10-v$V.log 2>&1 &
  done
  wait
fi

# 2. Held-out quality (MT-Bench 20 first turns, HumanEval 10; layer and draft logits in int8, as CPU pairs run them)
#    of the stage-9 head and both fine-tunes, on the held-out answers of earlier sessions; then the shipped head
#    (the 8,192-token fine-tune in float16). First the probe that led to the second fine-tune: the stage-9 head's
#    draft vocabulary widened without training (draft_vocab_probe.py).
if run 2; then
  old_head
  $P benchmarks/draft_vocab_probe.py --head runs/head9-shipped \
    --data runs/head8/data-self-instruct runs/head9/data-self-instruct --out $OUT/draft-vocab-probe-s14.json
  $P -m arborspec.offline.head_quality --threads 2 --n-mtbench $MT --n-humaneval 10 --max-new-tokens $N \
    --work-dir runs/head/heldout --int8-logits --int8-layers --head runs/head9-shipped \
    --out $OUT/head-quality-s14-head9-shipped.json
  for V in 8192 12288; do   # -> head-quality-s14-head10-v<V>.json
    $P -m arborspec.offline.head_quality --threads 2 --n-mtbench $MT --n-humaneval 10 --max-new-tokens $N \
      --work-dir runs/head/heldout --int8-logits --int8-layers --head runs/head10-v$V/model \
      --out $OUT/head-quality-s14-head10-v$V.json
  done
  $P -m arborspec.offline.head_quality --threads 2 --n-mtbench $MT --n-humaneval 10 --max-new-tokens $N \
    --work-dir runs/head/heldout --int8-logits --int8-layers --out $OUT/head-quality-s14.json
fi

# 3. The shipped stage-10 head against the stage-9 head (from git), interleaved per prompt in one process. This
#    session ran the first two with the script before it alternated the heads' order (384dcdf's
#    benchmarks/head_precision_ab.py: always the first --versions head right after plain decoding), old head first,
#    then (after step 4) new head first; the head run first measured 2-3 % faster, so the script now alternates,
#    and the third run is that.
if run 3; then
  old_head
  WT=$(mktemp -d)/arborspec-384dcdf
  git worktree add --detach "$WT" 384dcdf
  $P "$WT/benchmarks/head_precision_ab.py" --dtype int8 --temperature 0 --num-prompts $MT --max-new-tokens $N \
    --versions runs/head9-shipped src/arborspec/assets/smollm2-head --out $OUT/head-version-ab-t0-s14.json
  $P "$WT/benchmarks/head_precision_ab.py" --dtype int8 --temperature 0 --num-prompts $MT --max-new-tokens $N \
    --versions src/arborspec/assets/smollm2-head runs/head9-shipped --out $OUT/head-version-ab-t0-s14-reversed.json
  git worktree remove --force "$WT"
  $P benchmarks/head_precision_ab.py --dtype int8 --temperature 0 --num-prompts $MT --max-new-tokens $N \
    --versions runs/head9-shipped src/arborspec/assets/smollm2-head --out $OUT/head-version-ab-t0-s14-alternating.json
fi

# 4. The int8 target, T = 0, MT-Bench: DySpec at budgets 8 and 16 with and without context lookup (6 tokens) and
#    OPT-Tree 8 with lookup against plain int8 decoding, with HF generate and assisted generation on the same model.
if run 4; then
  rm -rf $OUT/int8-head-mtbench-t0-s14
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    --compare-hf-assisted --out $OUT/int8-head-mtbench-t0-s14 -m dyspec:budget=8 -m dyspec:budget=8:lookup=6 \
    -m dyspec:budget=16 -m dyspec:budget=16:lookup=6 -m opt-tree:budget=8:lookup=6
fi

# 5. HumanEval (10 prompts, T = 0) and MT-Bench at T = 0.6 (seed 0) with the stage-10 head.
if run 5; then
  rm -rf $OUT/int8-head-humaneval-t0-s14 $OUT/int8-head-mtbench-t06-s14
  $A bench --dtype int8 --prompts humaneval --num-prompts 10 --max-new-tokens $N --temperatures 0 --threads 2 \
    --compare-hf-assisted --out $OUT/int8-head-humaneval-t0-s14 -m dyspec:budget=8 -m dyspec:budget=8:lookup=6
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0.6 --threads 2 \
    --out $OUT/int8-head-mtbench-t06-s14 -m dyspec:budget=8 -m dyspec:budget=auto -m opt-tree:budget=auto
fi
