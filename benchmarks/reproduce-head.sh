#!/usr/bin/env bash
# Reproduce benchmarks/head-*: the embedded target with its shipped draft head (the default draft), interleaved with
# plain decoding in the same process; transformers generate() and assisted generation (with the distilled draft
# model, since transformers cannot run a head) as peers. Run from the repository root after `make setup`, on an
# otherwise idle machine. ~35 min on 2 CPU cores.
source "$(dirname "$0")/reproduce-common.sh"

# 0. Held-out quality and cost of the head (teacher forcing on the target's greedy answers).
.venv/bin/python -m arborspec.offline.head_quality --threads 2 --n-mtbench $MT --n-humaneval 10 --max-new-tokens $N \
  --work-dir runs/head/heldout --out $OUT/head-quality.json

# 1. MT-Bench, temperature 0: the best methods of the earlier sweep at budget 16, plus the transformers peers.
rm -rf $OUT/head-mtbench-t0
$A bench --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
  --compare-hf-assisted --out $OUT/head-mtbench-t0 \
  -m dyspec:budget=16 -m opt-tree:budget=16 -m eagle2:budget=16 -m sequoia:budget=16

# 2. MT-Bench, temperature 0.6 (seed 0): the sampled-tree methods (10 prompts in the committed run).
rm -rf $OUT/head-mtbench-t06
$A bench --prompts mt-bench --num-prompts ${MT06:-10} --max-new-tokens $N --temperatures 0.6 --threads 2 \
  --out $OUT/head-mtbench-t06 -m dyspec:budget=16 -m sequoia:budget=16
