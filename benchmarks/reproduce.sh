#!/usr/bin/env bash
# Reproduce the sweep of every method on the shipped default pair: the batch-invariant int8 target with its draft head
# (stage 11) on 2 CPU cores, MT-Bench first turns (20 x 128 new tokens) at T = 0 and 0.6 and HumanEval (10 x 128) at
# T = 0, each method interleaved per prompt with plain decoding in the same process, transformers' generate() and
# assisted generation as the peers. Every method at 4 draft nodes (DySpec also at 3, the size chosen on the validation
# slice, benchmarks/reproduce-s19.sh) with context lookup (lookup=6: grafted where the verifier takes any tree, i.e. at
# T = 0 for every method and at T = 0.6 for the selected-tree methods; docs/algorithms.md §9); Sequoia with the shape
# its DP gives for 4 nodes from a calibration of this pair. Run from the repository root after `make setup`, on an
# otherwise idle machine, ~40 min. The first session's sweep with the distilled draft: benchmarks/reproduce-distilled.sh.
source "$(dirname "$0")/reproduce-common.sh"
STEPS=${STEPS:-"1 2 3"}
METHODS="-m chain:budget=4:lookup=6 -m specinfer:budget=4:lookup=6 -m sequoia:shape=$OUT/sequoia-head/shape-4.json:lookup=6
  -m opt-tree:budget=4:lookup=6 -m eagle2:budget=4:lookup=6 -m c2t:budget=4:lookup=6 -m dyspec:budget=4:lookup=6
  -m dyspec:budget=3:lookup=6 -m dyspec-threshold:budget=4:lookup=6"

# 1. Sequoia: positional acceptance vector, t(n) and c for the default pair at T = 0.6, then the DP's shape for 4 nodes.
if run 1; then
  $A calibrate --dtype int8 --temperature 0.6 --out $OUT/sequoia-head/calibration.json
  $A sequoia-shape $OUT/sequoia-head/calibration.json --size 4 --depth 4 --out $OUT/sequoia-head/shape-4.json
fi

# 2. MT-Bench, every method, T = 0 and 0.6, with HF generate and HF assisted generation (T = 0).
if run 2; then
  rm -rf $OUT/all-methods-mtbench
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0,0.6 --threads 2 \
    --compare-hf-assisted --out $OUT/all-methods-mtbench $METHODS
fi

# 3. HumanEval, every method, T = 0.
if run 3; then
  rm -rf $OUT/all-methods-humaneval
  $A bench --dtype int8 --prompts humaneval --num-prompts 10 --max-new-tokens $N --temperatures 0 --threads 2 \
    --compare-hf-assisted --out $OUT/all-methods-humaneval $METHODS
fi
