#!/usr/bin/env bash
# Reproduce the sixth session's figures: the draft head retrained with self-instructed chat data (user messages the
# target writes itself, offline/self_instruct.py). Run from the repository root after `make setup`, on an otherwise
# idle machine (~45 min on 2 cores). The head itself: see src/arborspec/assets/smollm2-head/MODEL_CARD.md.
source "$(dirname "$0")/reproduce-common.sh"

# 0. The self-instructed prompts against the benchmark sets (needs the head's training data in runs/head), then
#    held-out quality and cost of the shipped head (teacher forcing on the target's greedy answers to MT-Bench and
#    HumanEval prompts, never used for training), with int8 draft logits (the CPU default) and float32 ones.
$P -m arborspec.offline.prompt_overlap --data-dir runs/head/data-self-instruct --out $OUT/self-instruct-overlap.json
$P -m arborspec.offline.head_quality --threads 2 --n-mtbench $MT --n-humaneval 10 --max-new-tokens $N \
  --work-dir runs/head/heldout --int8-logits --out $OUT/head-quality-int8.json
$P -m arborspec.offline.head_quality --threads 2 --n-mtbench $MT --n-humaneval 10 --max-new-tokens $N \
  --work-dir runs/head/heldout --out $OUT/head-quality.json

# 1. Before/after of this session's change (the head), same code: the previous shipped head (commit a9a179e) against
#    this one, each run interleaved with its own plain decoding.
PREV=$(mktemp -d)
git archive a9a179e src/arborspec/assets/smollm2-head | tar -x -C "$PREV"
ARGS="bench --prompts mt-bench --num-prompts 10 --max-new-tokens 64 --temperatures 0 --threads 2
      -m dyspec:budget=16 -m opt-tree:budget=16"
rm -rf $OUT/before-after-6
$A $ARGS --draft "$PREV/src/arborspec/assets/smollm2-head" --out $OUT/before-after-6/before
$A $ARGS --draft embedded-head --out $OUT/before-after-6/after
rm -rf "$PREV"

# 2. MT-Bench, temperature 0: budgets 8 and 16 (the cost curve is flat from 2 to 8 rows and jumps at 16), auto, and
#    the transformers peers.
rm -rf $OUT/chat-mtbench-t0
$A bench --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
  --compare-hf-assisted --out $OUT/chat-mtbench-t0 \
  -m dyspec:budget=8 -m dyspec:budget=auto -m opt-tree:budget=8 -m opt-tree:budget=16

# 3. MT-Bench, temperature 0.6 (seed 0): the sampled-tree method, fixed and auto.
rm -rf $OUT/chat-mtbench-t06
$A bench --prompts mt-bench --num-prompts ${MT06:-10} --max-new-tokens $N --temperatures 0.6 --threads 2 \
  --out $OUT/chat-mtbench-t06 -m dyspec:budget=16 -m dyspec:budget=auto
