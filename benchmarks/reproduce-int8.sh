#!/usr/bin/env bash
# Reproduce benchmarks/int8-* and cost-paths.json (fourth session): the batch-invariant int8 target (`--dtype int8`,
# docs/algorithms.md §8) against float32, and speculative decoding on it against plain int8 decoding.
# Run from the repository root after `make setup`, on an otherwise idle machine (2 cores). ~45 min.
source "$(dirname "$0")/reproduce-common.sh"

# 0. t(n): the float32 model's own forward, float32 decoder + LM-head rows on demand, and the same on int8,
#    interleaved in one process (200-token cache, 15 repeats).
$P benchmarks/cost_paths.py --out $OUT/cost-paths.json

# 1. What int8 gives up against float32: greedy agreement and perplexity (HumanEval canonical solutions,
#    teacher-forced) and identical greedy prefixes (MT-Bench first turns, 64 tokens).
$P benchmarks/int8_quality.py --num-prompts $MT --max-new-tokens 64 --out $OUT/int8-quality.json

# 2. MT-Bench, T = 0, int8 target: every method against plain int8 decoding, HF generate / assisted on the
#    same int8 model.
rm -rf $OUT/int8-mtbench-t0
$A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
  --compare-hf-assisted --out $OUT/int8-mtbench-t0 \
  -m dyspec:budget=auto -m dyspec:budget=16 -m opt-tree:budget=16

# 3. MT-Bench, T = 0.6 (seed 0), int8 target: the sampled-tree method, fixed and auto.
rm -rf $OUT/int8-mtbench-t06
$A bench --dtype int8 --prompts mt-bench --num-prompts ${MT06:-10} --max-new-tokens $N --temperatures 0.6 \
  --threads 2 --out $OUT/int8-mtbench-t06 -m dyspec:budget=16 -m dyspec:budget=auto
