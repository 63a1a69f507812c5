#!/usr/bin/env bash
# Reproduce benchmarks/draft-*: the fifth session's figures. The draft head retrained on more of the target's own
# text, its logits in int8 (the CPU default, `--draft-logits auto`), ordered draws at T = 0 (the default draft
# temperature 0). Run from the repository root after `make setup`, on an otherwise idle machine. ~55 min on 2 cores.
source "$(dirname "$0")/reproduce-common.sh"

# 0. Held-out quality and cost of the shipped head, float and int8 draft logits (teacher forcing on the target's
#    greedy answers to MT-Bench / HumanEval prompts, never used for training).
$P -m arborspec.offline.head_quality --threads 2 --n-mtbench $MT --n-humaneval 10 --max-new-tokens $N \
  --work-dir runs/head/heldout --out $OUT/head-quality.json
$P -m arborspec.offline.head_quality --threads 2 --n-mtbench $MT --n-humaneval 10 --max-new-tokens $N \
  --work-dir runs/head/heldout --int8-logits --out $OUT/head-quality-int8.json

# 1. MT-Bench, temperature 0: fixed budgets and budget=auto, plus the transformers peers.
rm -rf $OUT/draft-mtbench-t0
$A bench --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
  --compare-hf-assisted --out $OUT/draft-mtbench-t0 \
  -m opt-tree:budget=16 -m opt-tree:budget=auto -m dyspec:budget=16 -m dyspec:budget=auto -m sequoia:budget=16

# 1b. Before/after of the session's per-step changes with this same head (needs a checkout of the session's first
#     commit: git worktree add /work/wt-before5 a290101; skipped without it).
if [ -d "${BEFORE:-/work/wt-before5}" ]; then
  BEFORE=${BEFORE:-/work/wt-before5} OUT=$OUT/before-after-5 ./benchmarks/before-after.sh
fi

# 2. HumanEval, temperature 0, 10 prompts.
rm -rf $OUT/draft-humaneval-t0
$A bench --prompts humaneval --num-prompts 10 --max-new-tokens $N --temperatures 0 --threads 2 \
  --out $OUT/draft-humaneval-t0 -m opt-tree:budget=16 -m dyspec:budget=auto

# 3. MT-Bench, temperature 0.6 (seed 0): the sampled-tree methods, fixed and auto.
rm -rf $OUT/draft-mtbench-t06
$A bench --prompts mt-bench --num-prompts ${MT06:-10} --max-new-tokens $N --temperatures 0.6 --threads 2 \
  --out $OUT/draft-mtbench-t06 -m dyspec:budget=16 -m dyspec:budget=auto

# 4. The draft-side choices one at a time, T = 0, 10 prompts x 64 tokens: float draft logits; sampled draws
#    (draft temperature 1, the previous default).
rm -rf $OUT/draft-ablation
$A bench --prompts mt-bench --num-prompts 10 --max-new-tokens 64 --temperatures 0 --threads 2 \
  --draft-logits float --out $OUT/draft-ablation/float-logits -m dyspec:budget=16 -m opt-tree:budget=16
$A bench --prompts mt-bench --num-prompts 10 --max-new-tokens 64 --temperatures 0 --threads 2 \
  --draft-temperature 1 --out $OUT/draft-ablation/sampled-draws -m dyspec:budget=16 -m opt-tree:budget=16
$A bench --prompts mt-bench --num-prompts 10 --max-new-tokens 64 --temperatures 0 --threads 2 \
  --out $OUT/draft-ablation/defaults -m dyspec:budget=16 -m opt-tree:budget=16

# 5. The int8 target (docs/algorithms.md §8; plain decoding and HF generate run int8 too), T = 0, MT-Bench.
rm -rf $OUT/draft-int8-mtbench-t0
$A bench --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 --dtype int8 \
  --compare-hf-assisted --out $OUT/draft-int8-mtbench-t0 \
  -m opt-tree:budget=8 -m opt-tree:budget=auto -m dyspec:budget=auto
