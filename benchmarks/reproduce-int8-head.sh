#!/usr/bin/env bash
# Reproduce the ninth session's figures: the draft head with its layer in int8 (the CPU default, docs/algorithms.md
# §6), on the int8 target at T = 0 and 0.6 against plain int8 decoding, HF generate and HF assisted generation; the
# head's precision A/B in one process; and torch.compile's forward paths (docs/algorithms.md §7). Run from the
# repository root after `make setup`, on an otherwise idle machine (2 cores), ~60 min. STEPS="1 2" runs some steps.
source "$(dirname "$0")/reproduce-common.sh"
STEPS=${STEPS:-"0 1 2 3 4 5 6"}

# 0. Held-out quality and cost of the shipped head as CPU pairs now run it: layer and draft logits in int8.
if run 0; then
  $P -m arborspec.offline.head_quality --threads 2 --n-mtbench $MT --n-humaneval 10 --max-new-tokens $N \
    --work-dir runs/head/heldout --int8-logits --int8-layers --out $OUT/head-quality-int8-layers.json
fi

# 1. The int8 target, T = 0: DySpec and OPT-Tree at budget 8 and auto against plain int8 decoding, with HF generate
#    and assisted generation on the same int8 model.
if run 1; then
  rm -rf $OUT/int8-head-mtbench-t0-s9
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    --compare-hf-assisted --out $OUT/int8-head-mtbench-t0-s9 -m dyspec:budget=8 -m dyspec:budget=auto \
    -m dyspec:budget=auto:objective=long-run -m opt-tree:budget=8 -m opt-tree:budget=auto
fi

# 2. The int8 target, T = 0.6 (seed 0): the same methods and DySpec at budget 16.
if run 2; then
  rm -rf $OUT/int8-head-mtbench-t06-s9
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0.6 --threads 2 \
    --out $OUT/int8-head-mtbench-t06-s9 \
    -m dyspec:budget=8 -m dyspec:budget=16 -m dyspec:budget=auto -m dyspec:budget=auto:objective=long-run \
    -m opt-tree:budget=8 -m opt-tree:budget=auto
fi

# 3. The head's own precision, float layers against int8 layers, interleaved per prompt in one process (DySpec 8,
#    int8 target, T = 0; outputs checked identical to plain decoding).
if run 3; then
  $P benchmarks/head_precision_ab.py --dtype int8 --temperature 0 --num-prompts $MT --max-new-tokens $N \
    --out $OUT/head-precision-ab-t0.json
fi

# 4. t(n) of every forward path with and without torch.compile, interleaved, and the first (compiling) round.
if run 4; then
  $P benchmarks/cost_paths.py --compile --repeats 5 --sizes 1,2,4,8,16 --out $OUT/cost-paths-compile.json
fi

# 5. OPT-Tree at T = 0: budget 8 against auto with both objectives (the int8 target, 20 x 128).
if run 5; then
  rm -rf $OUT/opt-tree-objective-int8-t0
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    --out $OUT/opt-tree-objective-int8-t0 -m opt-tree:budget=8 -m opt-tree:budget=auto \
    -m opt-tree:budget=auto:objective=step
fi

# 6. DySpec at T = 0 on the final code (after the review that stopped computing draw moments for ordered draws):
#    budget 8 against auto.
if run 6; then
  rm -rf $OUT/dyspec-auto-int8-t0-final
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    --out $OUT/dyspec-auto-int8-t0-final -m dyspec:budget=8 -m dyspec:budget=auto
fi
