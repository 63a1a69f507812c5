#!/usr/bin/env bash
# Reproduce the eighteenth session's figures: the int8 target with the stage-11 head after the cost curve kept each
# size's fastest round (3e442df) and the faster greedy screen (2192a55): MT-Bench at T = 0 three times (the run-to-run
# spread on this machine is several per cent), T = 0.6 once, HumanEval at T = 0 once, and the screen's own A/B.
# Steps 1-4 ran at 2192a55; steps 5-6 at 7e19b28 (CostCurve.node_cost, since reverted), step 7 after it, step 8 at
# 7a443f8 (its ablation key node_cost=false, reverted with it): run steps 5, 6 and 8 from a
# checkout of 7a443f8. Step 9 only reads step 2's results files. Run from the repository root after `make setup`, on an
# otherwise idle machine (2 cores), ~90 min. STEPS="2" runs one step.
source "$(dirname "$0")/reproduce-common.sh"
STEPS=${STEPS:-"1 2 3 4 5 6 7 8 9"}

# 1. The greedy screen of one LM-head row before (fd6fbd8) and after 2192a55, in one process.
if run 1; then
  $P benchmarks/screen_row_ab.py --out $OUT/screen-row-ab-s18.json
fi

# 2. MT-Bench, T = 0, 20 x 128, three runs of the same command one after the other.
if run 2; then
  for R in a b c; do
    rm -rf $OUT/int8-head-mtbench-t0-s18-$R
    $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
      --out $OUT/int8-head-mtbench-t0-s18-$R -m dyspec:budget=auto:lookup=6 -m dyspec:budget=8:lookup=6 \
      -m opt-tree:budget=8:lookup=6
  done
fi

# 3. MT-Bench, T = 0.6, seed 0 (the rejection verifiers take no grafts: no lookup).
if run 3; then
  rm -rf $OUT/int8-head-mtbench-t06-s18
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0.6 --threads 2 \
    --out $OUT/int8-head-mtbench-t06-s18 -m dyspec:budget=auto -m dyspec:budget=8
fi

# 4. HumanEval, T = 0, 10 prompts x 128.
if run 4; then
  rm -rf $OUT/int8-head-humaneval-t0-s18
  $A bench --dtype int8 --prompts humaneval --num-prompts 10 --max-new-tokens $N --temperatures 0 --threads 2 \
    --out $OUT/int8-head-humaneval-t0-s18 -m dyspec:budget=auto:lookup=6 -m dyspec:budget=8:lookup=6
fi

# 5. MT-Bench, T = 0, after budget=auto learns what a node adds to a real step (CostCurve.node_cost): DySpec auto with
#    lookup beside DySpec 8 with lookup, four runs of the same command (a, b, then c, d in a second invocation with RUNS="c d").
if run 5; then
  for R in ${RUNS:-a b c d}; do
    rm -rf $OUT/int8-head-mtbench-t0-s18-node-$R
    $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
      --out $OUT/int8-head-mtbench-t0-s18-node-$R -m dyspec:budget=auto:lookup=6 -m dyspec:budget=8:lookup=6
  done
fi

# 6. MT-Bench, T = 0.6, seed 0, after the learnt per-node cost (as step 3).
if run 6; then
  rm -rf $OUT/int8-head-mtbench-t06-s18-node
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0.6 --threads 2 \
    --out $OUT/int8-head-mtbench-t06-s18-node -m dyspec:budget=auto -m dyspec:budget=8
fi

# 7. Where a step's time goes: DySpec 8 with lookup on 6 MT-Bench prompts, its calls timed in the generations.
if run 7; then
  $P benchmarks/step_split_probe.py --out $OUT/step-split-s18.json
fi

# 8. Before/after of the learnt per-node cost in one arborspec bench process, interleaved per prompt with plain
#    decoding: DySpec auto with lookup as now and with `node_cost=false` (nodes priced by the timed curve alone).
#    Run twice, the method run right after plain decoding swapped (that position gains 2-3 %, fourteenth session).
if run 8; then
  rm -rf $OUT/int8-head-mtbench-t0-s18-node-ab $OUT/int8-head-mtbench-t0-s18-node-ab-swapped
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    --out $OUT/int8-head-mtbench-t0-s18-node-ab -m dyspec:budget=auto:lookup=6:node_cost=false \
    -m dyspec:budget=auto:lookup=6
  $A bench --dtype int8 --prompts mt-bench --num-prompts $MT --max-new-tokens $N --temperatures 0 --threads 2 \
    --out $OUT/int8-head-mtbench-t0-s18-node-ab-swapped -m dyspec:budget=auto:lookup=6 \
    -m dyspec:budget=auto:lookup=6:node_cost=false
fi

# 9. Per method, a step's verification slope per tree node beside the one the run's timed curve gives (runs a and b).
if run 9; then
  for R in a b; do $P benchmarks/step_stats.py $OUT/int8-head-mtbench-t0-s18-$R/results.jsonl; done
fi
