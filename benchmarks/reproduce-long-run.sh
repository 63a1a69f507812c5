#!/usr/bin/env bash
# Reproduce the eighth session's figures: budget=auto sized for the generation's throughput (objective=long-run,
# E[A](n) - lam x cost(n)) with the acceptance model and rate carried between generations (docs/algorithms.md §7),
# against the per-step rule (objective=step) and the fixed budgets, on the int8 and float32 targets, and the
# estimated-vs-actual accepted length of every drafter. Run from the repository root after `make setup`, on an
# otherwise idle machine (2 cores). ~80 min. Step 5 needs a checkout of the session's starting commit:
#   git worktree add --detach /work/wt-before 0e02a54
set -euo pipefail
A=.venv/bin/arborspec
OUT=benchmarks
MT=${MT:-20}        # MT-Bench first turns
N=${N:-128}         # new tokens per generation

# 1. The int8 target with the draft head, T = 0: auto (both objectives) and the best fixed budgets against plain
#    int8 decoding, with HF generate / assisted generation on the same int8 model.
rm -rf $OUT/int8-head-mtbench-t0
$A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
  --compare-hf-assisted --out $OUT/int8-head-mtbench-t0 \
  -m dyspec:budget=auto -m dyspec:budget=auto:objective=step -m dyspec:budget=8 \
  -m opt-tree:budget=auto -m opt-tree:budget=8

# 2. Float32, T = 0.6 (seed 0): both builders, auto against their fixed budgets.
rm -rf $OUT/auto-mtbench-t06
$A bench --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0.6 --threads 2 \
  --out $OUT/auto-mtbench-t06 -m dyspec:budget=auto -m dyspec:budget=auto:objective=step -m dyspec:budget=8 \
  -m dyspec:budget=16 -m opt-tree:budget=auto -m opt-tree:budget=8

# 3. Estimated vs actual accepted length for the other two drafters (T = 0 and 0.6, fixed budgets).
for D in embedded-draft ngram; do
  rm -rf $OUT/estimate-$D
  $A bench --draft $D --prompts mt-bench --num-prompts 10 --max-new-tokens $N --temperatures 0,0.6 --threads 2 \
    --out $OUT/estimate-$D -m dyspec:budget=16 -m opt-tree:budget=16
done

# 4. Float32, T = 0, and the int8 target at T = 0.6 (seed 0).
rm -rf $OUT/auto-mtbench-t0
$A bench --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
  --compare-hf-assisted --out $OUT/auto-mtbench-t0 \
  -m dyspec:budget=auto -m dyspec:budget=8 -m opt-tree:budget=auto -m opt-tree:budget=8
rm -rf $OUT/int8-head-mtbench-t06
$A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0.6 --threads 2 \
  --out $OUT/int8-head-mtbench-t06 -m dyspec:budget=auto -m dyspec:budget=8 -m dyspec:budget=16

# 5. Before/after of the whole change (same head, 10 MT-Bench prompts x 64 tokens, each run interleaved with plain
#    decoding in its own process; BEFORE = the session's starting commit).
TEMPS=0 EXTRA="--dtype int8" METHODS="-m dyspec:budget=auto -m opt-tree:budget=auto" \
  OUT=$OUT/before-after-8/int8-t0 benchmarks/before-after.sh
TEMPS=0.6 METHODS="-m dyspec:budget=auto" OUT=$OUT/before-after-8/t06 benchmarks/before-after.sh
