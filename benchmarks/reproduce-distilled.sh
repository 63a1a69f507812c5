#!/usr/bin/env bash
# Reproduce benchmarks/run/ (first session, the distilled draft): Sequoia calibration + shapes for the embedded target
# with --draft embedded-draft, then the full sweep and its report. The shipped default pair (int8 target + draft head)
# is swept by benchmarks/reproduce.sh.
# Run from the repository root after `make setup` (or `make demo`). Takes ~35 min on 2 CPU cores.
source "$(dirname "$0")/reproduce-common.sh"
NUM_PROMPTS=${NUM_PROMPTS:-6}
MAX_NEW=${MAX_NEW:-40}

# 1. Sequoia: positional acceptance vector, t(n) and c for the embedded pair at temperature 0.6, then the
#    optimal shape (DP, App. C.2.2) for each budget, depth <= 8.
$A calibrate --draft embedded-draft --temperature 0.6 --out $OUT/sequoia/calibration.json
for B in 8 16 32 64; do
  $A sequoia-shape $OUT/sequoia/calibration.json --size $B --depth 8 --out $OUT/sequoia/shape-$B.json
done

# 2. Every method at budgets 8/16/32/64, temperature 0 and 0.6, MT-Bench first turns, interleaved with plain decoding.
rm -rf $OUT/run
$A bench --draft embedded-draft --prompts mt-bench --num-prompts $NUM_PROMPTS --max-new-tokens $MAX_NEW \
  --temperatures 0,0.6 --threads 2 --compare-hf-assisted --out $OUT/run \
  -m chain:budget=8,16,32,64 -m specinfer:budget=8,16,32,64 \
  -m sequoia:shape=$OUT/sequoia/shape-8.json -m sequoia:shape=$OUT/sequoia/shape-16.json \
  -m sequoia:shape=$OUT/sequoia/shape-32.json -m sequoia:shape=$OUT/sequoia/shape-64.json \
  -m opt-tree:budget=8,16,32,64 -m eagle2:budget=8,16,32,64 -m c2t:budget=8,16,32,64 \
  -m dyspec:budget=8,16,32,64 -m dyspec-threshold:budget=8,16,32,64

# 3. Tables and plots from the saved results (no model runs).
$A report $OUT/run/results.jsonl --out $OUT/run
