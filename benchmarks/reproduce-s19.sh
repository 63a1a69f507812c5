#!/usr/bin/env bash
# Reproduce the nineteenth session's figures: which fixed tree size DySpec with the draft head and context lookup
# should run on this CPU, chosen on a validation slice of MT-Bench (questions the benchmark does not measure), then
# measured on the benchmark's 20 prompts at T = 0 (three runs, the methods' order rotated: the method right after
# plain decoding gains 2-3 %), at T = 0.6 and on HumanEval, and DySpec 16's accepted length. Steps 2-6 ran at f9bb544,
# step 7 at 4c7a5e5 (fixes to the offline tools only: the step loop is the same code). Run a of step 4 was run after
# steps 5 and 6 (its first run overlapped other commands and was discarded).
# Run from the repository root after `make setup`, on an otherwise idle machine (2 cores), ~80 min.
# STEPS="2" runs one step.
source "$(dirname "$0")/reproduce-common.sh"
STEPS=${STEPS:-"1 2 3 4 5 6 7 8 9"}
V=$OUT/mtbench-validation.jsonl

# 1. The validation slice: every third of MT-Bench's questions 21-80 (20 prompts, six categories).
if run 1; then
  $P benchmarks/validation_prompts.py --out $V
fi

# 2. Tree sizes on the validation slice, T = 0, 20 x 128, twice (the second run in another order, with budget=auto).
if run 2; then
  rm -rf $OUT/int8-head-validation-t0-s19 $OUT/int8-head-validation-t0-s19-repeat
  $A bench --dtype int8 --prompts $V --num-prompts 20 --max-new-tokens $N --temperatures 0 --threads 2 \
    --out $OUT/int8-head-validation-t0-s19 -m dyspec:budget=8:lookup=6 -m dyspec:budget=4:lookup=6 \
    -m dyspec:budget=2:lookup=6 -m dyspec:budget=6:lookup=6 -m dyspec:budget=3:lookup=6
  $A bench --dtype int8 --prompts $V --num-prompts 20 --max-new-tokens $N --temperatures 0 --threads 2 \
    --out $OUT/int8-head-validation-t0-s19-repeat -m dyspec:budget=4:lookup=6 -m dyspec:budget=3:lookup=6 \
    -m dyspec:budget=2:lookup=6 -m dyspec:budget=auto:lookup=6
fi

# 3. The same sizes on the benchmark's prompts (MT-Bench 1-20), before the choice was fixed: two runs.
if run 3; then
  rm -rf $OUT/int8-head-mtbench-t0-s19-sizes $OUT/int8-head-mtbench-t0-s19-sizes-2
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    --out $OUT/int8-head-mtbench-t0-s19-sizes -m dyspec:budget=4:lookup=6 -m dyspec:budget=6:lookup=6 \
    -m dyspec:budget=8:lookup=6 -m dyspec:budget=5:lookup=6
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    --out $OUT/int8-head-mtbench-t0-s19-sizes-2 -m dyspec:budget=5:lookup=6 -m dyspec:budget=3:lookup=6 \
    -m dyspec:budget=4:lookup=6 -m dyspec:budget=2:lookup=6
fi

# 4. The chosen size (3) on the benchmark's prompts, T = 0, beside budget=auto and the former default size 8, three
#    runs with the methods' order rotated.
if run 4; then
  M3=dyspec:budget=3:lookup=6; MA=dyspec:budget=auto:lookup=6; M8=dyspec:budget=8:lookup=6
  for R in "a $M3 $MA $M8" "b $MA $M8 $M3" "c $M8 $M3 $MA"; do
    set -- $R
    rm -rf $OUT/int8-head-mtbench-t0-s19-$1
    $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
      --out $OUT/int8-head-mtbench-t0-s19-$1 -m $2 -m $3 -m $4
  done
fi

# 5. MT-Bench, T = 0.6, seed 0 (the rejection verifiers take no grafts: no lookup).
if run 5; then
  rm -rf $OUT/int8-head-mtbench-t06-s19
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0.6 --threads 2 \
    --out $OUT/int8-head-mtbench-t06-s19 -m dyspec:budget=3 -m dyspec:budget=auto -m dyspec:budget=8
fi

# 6. HumanEval, T = 0, 10 prompts x 128.
if run 6; then
  rm -rf $OUT/int8-head-humaneval-t0-s19
  $A bench --dtype int8 --prompts humaneval --num-prompts 10 --max-new-tokens $N --temperatures 0 --threads 2 \
    --out $OUT/int8-head-humaneval-t0-s19 -m dyspec:budget=3:lookup=6 -m dyspec:budget=8:lookup=6
fi

# 7. DySpec 16's accepted length at T = 0 on MT-Bench (issue 8's aim of 2.5), without and with lookup.
if run 7; then
  rm -rf $OUT/int8-head-mtbench-t0-s19-dyspec16
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    --out $OUT/int8-head-mtbench-t0-s19-dyspec16 -m dyspec:budget=16 -m dyspec:budget=16:lookup=6
fi

# 8. Per step of the size runs (step 3): wall time, verification, draft forwards and builder per step, the
#    verification slope per node beside the curve's (reads the results files only).
if run 8; then
  for R in sizes sizes-2; do $P benchmarks/step_stats.py $OUT/int8-head-mtbench-t0-s19-$R/results.jsonl; done
fi

# 9. The final code (after the review's refactor of how a draft head gets the target's features outside the step loop,
#    ac28c7f, which the cost curve's draft timing uses): the former size 8 (before) and the shipped 3 (after) in one
#    process, interleaved per prompt with plain decoding, with budget=auto.
if run 9; then
  rm -rf $OUT/int8-head-mtbench-t0-s19-final
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    --out $OUT/int8-head-mtbench-t0-s19-final -m dyspec:budget=8:lookup=6 -m dyspec:budget=3:lookup=6 \
    -m dyspec:budget=auto:lookup=6
fi
