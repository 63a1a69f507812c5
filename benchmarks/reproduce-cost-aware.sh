#!/usr/bin/env bash
# Reproduce the seventh session's figures: budget=auto that stops growing on calibrated values, the draft head on
# the batch-invariant int8 target (docs/algorithms.md §7-8), and the estimated-vs-actual accepted length of every
# drafter. Run from the repository root after `make setup`, on an otherwise idle machine (2 cores). ~100 min.
# Step 0 needs a checkout of the session's starting commit: git worktree add /work/wt-before ac40151
source "$(dirname "$0")/reproduce-common.sh"

# 0. Before/after of the growth rule and the learnt step overhead (same head, 10 MT-Bench prompts x 64 tokens, each interleaved with plain decoding
#    in its own process): budget=auto on the int8 target at T = 0, and DySpec at T = 0.6 in float32.
TEMPS=0 EXTRA="--dtype int8" METHODS="-m dyspec:budget=auto -m opt-tree:budget=auto -m dyspec:budget=8" \
  OUT=$OUT/before-after-7/int8-t0 benchmarks/before-after.sh
TEMPS=0.6 METHODS="-m dyspec:budget=auto -m dyspec:budget=16" OUT=$OUT/before-after-7/t06 benchmarks/before-after.sh

# 1. The int8 target with the draft head, T = 0: auto and the best fixed budgets against plain int8 decoding, with
#    HF generate / assisted generation on the same int8 model.
rm -rf $OUT/int8-head-mtbench-t0
$A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
  --compare-hf-assisted --out $OUT/int8-head-mtbench-t0 \
  -m dyspec:budget=auto -m dyspec:budget=8 -m opt-tree:budget=auto -m opt-tree:budget=8

# 2. Float32, T = 0.6 (seed 0): DySpec auto against its fixed budgets.
rm -rf $OUT/auto-mtbench-t06
$A bench --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0.6 --threads 2 \
  --out $OUT/auto-mtbench-t06 -m dyspec:budget=auto -m dyspec:budget=8 -m dyspec:budget=16

# 3. Estimated vs actual accepted length for the other two drafters (T = 0 and 0.6, fixed budgets).
for D in embedded-draft ngram; do
  rm -rf $OUT/estimate-$D
  $A bench --draft $D --prompts mt-bench --num-prompts 10 --max-new-tokens $N --temperatures 0,0.6 --threads 2 \
    --out $OUT/estimate-$D -m dyspec:budget=16 -m opt-tree:budget=16
done

# 4. The int8 target at T = 0.6 (seed 0).
rm -rf $OUT/int8-head-mtbench-t06
$A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0.6 --threads 2 \
  --out $OUT/int8-head-mtbench-t06 -m dyspec:budget=auto -m dyspec:budget=16

# 5. Float32, T = 0: auto against the best fixed budgets of both builders, with the transformers peers.
rm -rf $OUT/auto-mtbench-t0
$A bench --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
  --compare-hf-assisted --out $OUT/auto-mtbench-t0 \
  -m dyspec:budget=auto -m dyspec:budget=8 -m opt-tree:budget=auto -m opt-tree:budget=8
