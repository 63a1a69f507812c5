#!/usr/bin/env bash
# Reproduce the fifteenth to seventeenth sessions' figures: an eleventh head stage (fresh self-instructed data, then a
# fine-tune of the stage-10 head on the stage-8 to 11 data, continued once), its held-out quality, the int8 target at
# T = 0 and 0.6 with it, and the value temperature of T = 0's ordered draws. Run from the repository root after
# `make setup`, on an otherwise idle machine (2 cores). STEPS="2" runs one step.
# Step 1 generates and trains (~120 min; it needs runs/head8, head9 and head10/data-self-instruct from
# reproduce-s12.sh, reproduce-s13.sh and reproduce-s14.sh step 1); steps 2-12 measure (~105 min).
# Step 1 ran in the fifteenth and sixteenth sessions (their runs/ did not survive); steps 2-12 in the seventeenth.
# Steps 2-7 ran at 4ca069d, before ordered draws were valued at temperature 0.8 (step 9): from a checkout of 4ca069d
# they give those figures again; on later code steps 4-6 value the draws at 0.8 (step 12 runs both in one process). Step 2's first loop needs step 1's
# runs (skipped in the seventeenth session; the fifteenth measured the 14-minute fine-tune at MT-Bench 0.5047 / 0.445
# / 0.417 with the same command).
source "$(dirname "$0")/reproduce-common.sh"
STEPS=${STEPS:-"1 2 3 4 5 6 7 8 9 10 11 12"}
PREV=07a94a0        # the fourteenth session's last commit: the stage-10 head
old_head() {        # the stage-10 head, from git
  mkdir -p runs/head10-shipped
  git show $PREV:src/arborspec/assets/smollm2-head/head.safetensors > runs/head10-shipped/head.safetensors
  git show $PREV:src/arborspec/assets/smollm2-head/head.json > runs/head10-shipped/head.json
}

# 1. Stage-11 data (self-instructed with generic openings, seed 6: batches no earlier stage saw, 70 min; fifteenth
#    session) and its overlap with the benchmark prompts; then a fine-tune of the stage-10 head on the stage-8 to 11
#    data together (the cosine of 2 epochs cut at 14 min, --ce-weight 3.0, the 8,192-token draft vocabulary recounted
#    on that data, as stage 10; fifteenth session), continued for 30 min at a lower peak learning rate (sixteenth
#    session), exported in float16 into the package. Two threads throughout; each run loads its data for ~2 min first.
if run 1; then
  old_head
  $A train-head --out runs/head11/gen-only --work-dir runs/head11 --self-instruct 16384 --self-instruct-openings \
    --seed 6 --data-time-budget-s 4200 --init-from runs/head10-shipped --epochs 0.01 --lr 5e-4 \
    --train-time-budget-s 5 --threads 2
  $P -m arborspec.offline.prompt_overlap --data-dir runs/head11/data-self-instruct \
    --out $OUT/self-instruct-overlap-s15.json
  mkdir -p runs/head11-data/data-self-instruct   # the four stages' shards, renamed apart
  for S in 8 9 10 11; do
    for f in runs/head$S/data-self-instruct/shard_*.safetensors; do
      ln -sfn ../../head$S/data-self-instruct/$(basename $f) \
        runs/head11-data/data-self-instruct/shard_$(printf %02d $S)$(basename $f | cut -c8-)
    done
  done
  $A train-head --out runs/head11-data/model --work-dir runs/head11-data --skip-data --init-from runs/head10-shipped \
    --epochs 2 --lr 5e-4 --ce-weight 3.0 --draft-vocab 8192 --train-time-budget-s 840 --threads 2 --seed 6
  mkdir -p runs/head11-ft && ln -sfn ../head11-data/data-self-instruct runs/head11-ft/data-self-instruct
  $A train-head --out runs/head11-ft/model --work-dir runs/head11-ft --skip-data --init-from runs/head11-data/model \
    --epochs 2 --lr 3e-4 --ce-weight 3.0 --draft-vocab 8192 --train-time-budget-s 1800 --threads 2 --seed 7
  $P - <<'PY'   # the float16 export: the same weights rounded, the training record kept in head.json
import json
import torch
from arborspec.drafters.head import load_head
from arborspec.models import load_model
src, dst = "runs/head11-ft/model", "src/arborspec/assets/smollm2-head"
target = load_model("embedded")
head = load_head(src, target)
training = json.load(open(f"{src}/head.json"))["training"]
head.save(dst, "embedded", target, extra={"training": training}, weights_dtype=torch.float16)
PY
fi

# 2. Held-out quality (MT-Bench 20 first turns, HumanEval 10; layer and draft logits in int8, as CPU pairs run them)
#    of the 14-minute fine-tune (fifteenth session), of its continuation, then of the shipped head (the continuation
#    in float16), on the held-out answers of earlier sessions (the stage-10 head's: benchmarks/head-quality-s14.json).
if run 2; then
  for H in runs/head11-data/model runs/head11-ft/model; do
    [[ -d $H ]] || continue   # step 1's heads, where this checkout has them
    $P -m arborspec.offline.head_quality --threads 2 --n-mtbench $MT --n-humaneval 10 --max-new-tokens $N \
      --work-dir runs/head/heldout --int8-logits --int8-layers --head $H \
      --out $OUT/head-quality-s16-$(basename ${H%/model}).json
  done
  $P -m arborspec.offline.head_quality --threads 2 --n-mtbench $MT --n-humaneval 10 --max-new-tokens $N \
    --work-dir runs/head/heldout --int8-logits --int8-layers --out $OUT/head-quality-s16.json
fi

# 3. The shipped stage-11 head against the stage-10 head (from git), interleaved per prompt in one process, the two
#    heads' order alternating from prompt to prompt.
if run 3; then
  old_head
  $P benchmarks/head_precision_ab.py --dtype int8 --temperature 0 --num-prompts $MT --max-new-tokens $N \
    --versions runs/head10-shipped src/arborspec/assets/smollm2-head --out $OUT/head-version-ab-t0-s16.json
fi

# 4. The int8 target, T = 0, MT-Bench: DySpec at budgets 8 and 16 with and without context lookup (6 tokens) and
#    OPT-Tree 8 with lookup against plain int8 decoding, with HF generate and assisted generation on the same model.
if run 4; then
  rm -rf $OUT/int8-head-mtbench-t0-s16
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    --compare-hf-assisted --out $OUT/int8-head-mtbench-t0-s16 -m dyspec:budget=8 -m dyspec:budget=8:lookup=6 \
    -m dyspec:budget=16 -m dyspec:budget=16:lookup=6 -m opt-tree:budget=8:lookup=6
fi

# 5. HumanEval (10 prompts, T = 0) and MT-Bench at T = 0.6 (seed 0) with the stage-11 head.
if run 5; then
  rm -rf $OUT/int8-head-humaneval-t0-s16 $OUT/int8-head-mtbench-t06-s16
  $A bench --dtype int8 --prompts humaneval --num-prompts 10 --max-new-tokens $N --temperatures 0 --threads 2 \
    --compare-hf-assisted --out $OUT/int8-head-humaneval-t0-s16 -m dyspec:budget=8 -m dyspec:budget=8:lookup=6
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0.6 --threads 2 \
    --out $OUT/int8-head-mtbench-t06-s16 -m dyspec:budget=8 -m dyspec:budget=auto -m opt-tree:budget=auto
fi

# 6. Two repeats of step 4's two best settings (seventeenth session: DySpec 8 with lookup measured 1.31x in step 4,
#    and the same setting 1.22-1.28x with stages 9-10), one after the other.
if run 6; then
  for R in repeat repeat2; do
    rm -rf $OUT/int8-head-mtbench-t0-s16-$R
    $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
      --out $OUT/int8-head-mtbench-t0-s16-$R -m dyspec:budget=8:lookup=6 -m opt-tree:budget=8:lookup=6
  done
fi

# 7. Stage 11's user messages written again (seed 6, the 107 batches the stage generated; no answers) and their
#    overlap with the benchmark prompts: step 1's overlap check, for a checkout without step 1's shards. The count of
#    closed messages is checked against the 2614 the stage stored.
if run 7; then
  $P benchmarks/self_instruct_overlap_regen.py --seed 6 --batches 107 --openings --expect 2614 \
    --out $OUT/self-instruct-overlap-s15.json
fi

# 8. Where a tree forward's extra time goes: one row against nine over a 300-token cache, by operator; the float64
#    attention kernel alone; the greedy screen of one LM-head row.
if run 8; then
  $P benchmarks/forward_rows_probe.py --out $OUT/forward-rows-probe-s17.json
fi

# 9. The value temperature of ordered draws at T = 0 (engine/sampling.ORDERED_VALUE_TEMPERATURE, 0.8 since the
#    seventeenth session; 1.0 before): chosen on the last 16 prompts of the built-in training pool (accepted lengths
#    only, no lookup); its speed against 1.0 on MT-Bench is step 12.
if run 9; then
  $P - <<'PY'   # why: acceptance of DySpec 16's examined children by draft probability, from step 4's results
import json
from arborspec.bench.metrics import acceptance_by_draft_prob
from arborspec.bench.report import read_results
runs = [r for r in read_results("benchmarks/int8-head-mtbench-t0-s16/results.jsonl")[1] if r["method"] == "dyspec:budget=16"]
centres, rates, counts = acceptance_by_draft_prob(runs)
rows = [{"draft_prob": f"{c - 0.05:.1f}-{c + 0.05:.1f}", "accepted": None if r is None else round(r, 3), "children": n}
        for c, r, n in zip(centres, rates, counts)]
json.dump({"results": "benchmarks/int8-head-mtbench-t0-s16/results.jsonl", "method": "dyspec:budget=16", "bins": rows},
          open("benchmarks/acceptance-by-draft-prob-s16.json", "w"), indent=2)
print(json.dumps(rows))
PY
  $P benchmarks/ordered_value_ab.py --num-prompts 16 --budgets 16 8 --temperatures 1.0 0.9 0.8 0.7 \
    --out $OUT/ordered-value-pool-s17.json
fi

# 10. MT-Bench, T = 0, with ordered draws valued at 0.8: DySpec 16 with and without lookup, DySpec 8 with lookup.
if run 10; then
  rm -rf $OUT/int8-head-mtbench-t0-s17-value08
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    --out $OUT/int8-head-mtbench-t0-s17-value08 -m dyspec:budget=8:lookup=6 -m dyspec:budget=16 -m dyspec:budget=16:lookup=6
fi

# 11. budget=auto at T = 0 with ordered draws valued at 0.8, with and without lookup, beside DySpec 8 with lookup.
if run 11; then
  rm -rf $OUT/int8-head-mtbench-t0-s17-auto
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    --out $OUT/int8-head-mtbench-t0-s17-auto -m dyspec:budget=auto -m dyspec:budget=auto:lookup=6 -m dyspec:budget=8:lookup=6
fi

# 12. Before/after of the value temperature in one arborspec bench run, interleaved per prompt with plain decoding:
#     value_temperature=1.0 (the old valuation) beside the default 0.8, DySpec 8 with lookup and DySpec 16.
if run 12; then
  rm -rf $OUT/int8-head-mtbench-t0-s17-value-ab
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    --out $OUT/int8-head-mtbench-t0-s17-value-ab -m dyspec:budget=8:lookup=6:value_temperature=1.0 \
    -m dyspec:budget=8:lookup=6 -m dyspec:budget=16:value_temperature=1.0 -m dyspec:budget=16
fi
