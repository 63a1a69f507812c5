#!/usr/bin/env bash
# Reproduce the eighth session's figures: budget=auto sized for the generation's throughput (objective=long-run,
# E[A](n) - lam x cost(n)) with the acceptance model and rate carried between generations (docs/algorithms.md §7),
# against the per-step rule (objective=step) and the fixed budgets, on the int8 and float32 targets; the
# estimated-vs-actual accepted length of every drafter; before/after; the torch.compile paths. Run from the
# repository root after `make setup`, on an otherwise idle machine (2 cores), ~90 min. STEPS="1 2" runs some steps.
# Step 4 needs a checkout of the session's starting commit: git worktree add --detach /work/wt-before 0e02a54
# In the eighth session steps 0-3 ran (1 and 2 on a96cf3f, 3 on db957c9; step 1 before its prefetch_all row was
# added); steps 4-6 and a re-run of step 1 on the final code were not run, for time.
source "$(dirname "$0")/reproduce-common.sh"
STEPS=${STEPS:-"0 1 2 3 4 5 6"}

# 0. Held-out quality and cost of the shipped head (teacher forcing on the target's greedy answers to MT-Bench and
#    HumanEval prompts, never used for training), int8 draft logits (the CPU default).
if run 0; then
  $P -m arborspec.offline.head_quality --threads 2 --n-mtbench $MT --n-humaneval 10 --max-new-tokens $N \
    --work-dir runs/head/heldout --int8-logits --out $OUT/head-quality-int8.json
fi

# 1. The int8 target with the draft head, T = 0: auto (both objectives) and the best fixed budgets against plain
#    int8 decoding, with HF generate / assisted generation on the same int8 model.
if run 1; then
  rm -rf $OUT/int8-head-mtbench-t0
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    --compare-hf-assisted --out $OUT/int8-head-mtbench-t0 \
    -m dyspec:budget=auto -m dyspec:budget=auto:objective=step -m dyspec:budget=auto:prefetch_all=true \
    -m dyspec:budget=8 -m opt-tree:budget=auto -m opt-tree:budget=8
fi

# 2. Float32, T = 0.6 (seed 0): both builders, auto against their fixed budgets.
if run 2; then
  rm -rf $OUT/auto-mtbench-t06
  $A bench --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0.6 --threads 2 \
    --out $OUT/auto-mtbench-t06 -m dyspec:budget=auto -m dyspec:budget=auto:objective=step -m dyspec:budget=8 \
    -m dyspec:budget=16 -m opt-tree:budget=auto -m opt-tree:budget=8
fi

# 3. Estimated vs actual accepted length for the other two drafters (T = 0 and 0.6, fixed budgets).
if run 3; then
  for D in embedded-draft ngram; do
    rm -rf $OUT/estimate-$D
    $A bench --draft $D --prompts mt-bench --num-prompts 10 --max-new-tokens $N --temperatures 0,0.6 --threads 2 \
      --out $OUT/estimate-$D -m dyspec:budget=16 -m opt-tree:budget=16
  done
fi

# 4. Before/after of the whole change (same head, 10 MT-Bench prompts x 64 tokens, each run interleaved with plain
#    decoding in its own process; BEFORE = the session's starting commit).
if run 4; then
  TEMPS=0 EXTRA="--dtype int8" METHODS="-m dyspec:budget=auto -m opt-tree:budget=auto" \
    OUT=$OUT/before-after-8/int8-t0 benchmarks/before-after.sh
  TEMPS=0.6 METHODS="-m dyspec:budget=auto" OUT=$OUT/before-after-8/t06 benchmarks/before-after.sh
fi

# 5. t(n) of every forward path with and without torch.compile (--compile), interleaved in one process, and the
#    first (compiling) round of each.
if run 5; then
  $P benchmarks/cost_paths.py --compile --repeats 5 --sizes 1,2,4,8,16 --out $OUT/cost-paths-compile.json
fi

# 6. Float32, T = 0, and the int8 target at T = 0.6 (seed 0).
if run 6; then
  rm -rf $OUT/auto-mtbench-t0
  $A bench --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    --compare-hf-assisted --out $OUT/auto-mtbench-t0 \
    -m dyspec:budget=auto -m dyspec:budget=8 -m opt-tree:budget=auto -m opt-tree:budget=8
  rm -rf $OUT/int8-head-mtbench-t06
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0.6 --threads 2 \
    --out $OUT/int8-head-mtbench-t06 -m dyspec:budget=auto -m dyspec:budget=8 -m dyspec:budget=16
fi
