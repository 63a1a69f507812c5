#!/usr/bin/env bash
# Reproduce benchmarks/speed-*: the third session's figures (draft head trained longer on more data, the LM head on
# demand, budget=auto, the draft temperature at T = 0). Run from the repository root after `make setup`, on an
# otherwise idle machine (2 cores: nothing else running). ~60 min.
source "$(dirname "$0")/reproduce-common.sh"

# 0. t(n) of the target's forward paths, interleaved in one process: the model's own logits on every row (how every
#    step ran before) vs the decoder + LM-head rows on demand (how a step runs now; 2 rows read = accepted length 2).
$P benchmarks/cost_paths.py --out $OUT/cost-paths.json

# 1. Held-out quality and cost of the shipped head (teacher forcing on the target's greedy answers).
$P -m arborspec.offline.head_quality --threads 2 --n-mtbench $MT --n-humaneval 10 --max-new-tokens $N \
  --work-dir runs/head/heldout --out $OUT/head-quality.json

# 2. Draft-side temperature at T = 0 (greedy verification: the output never changes), 5 prompts x 64 tokens.
for DT in 0.3 0.6 1.0; do
  rm -rf $OUT/speed-draft-temperature/dt-$DT
  $A bench --prompts mt-bench --num-prompts 5 --max-new-tokens 64 --temperatures 0 --threads 2 \
    --draft-temperature $DT --out $OUT/speed-draft-temperature/dt-$DT -m dyspec:budget=16 -m sequoia:budget=16
done

# 3. MT-Bench, temperature 0: fixed budgets and budget=auto, plus the transformers peers.
rm -rf $OUT/speed-mtbench-t0
$A bench --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
  --compare-hf-assisted --out $OUT/speed-mtbench-t0 \
  -m opt-tree:budget=16 -m opt-tree:budget=auto -m dyspec:budget=16 -m dyspec:budget=auto

# 4. MT-Bench, temperature 0.6 (seed 0): the sampled-tree methods, fixed and auto.
rm -rf $OUT/speed-mtbench-t06
$A bench --prompts mt-bench --num-prompts ${MT06:-10} --max-new-tokens $N --temperatures 0.6 --threads 2 \
  --out $OUT/speed-mtbench-t06 -m dyspec:budget=16 -m dyspec:budget=auto
