#!/usr/bin/env bash
# Regenerate every figure that README.md and benchmarks/README.md quote, on the current code.
#
#   benchmarks/reproduce.sh quick          # ~10 min on 2 cores: a smaller version of the README table
#   benchmarks/reproduce.sh full           # ~4 h on 2 cores: the README table and the evidence docs cite
#   benchmarks/reproduce.sh full 3 4       # only steps 3 and 4 of a mode
#
# Run from the repository root after `make setup`, with no other heavy process running: every speedup is a
# same-process ratio to plain decoding, but a second heavy process still distorts it. Raw runs go to
# runs/ (not versioned); what a reader needs (report.md, summary.json, two plots) is copied into
# benchmarks/results/. A step that is interrupted can be rerun alone; `arborspec bench` runs resume
# with RESUME=1.
set -euo pipefail
cd "$(dirname "$0")/.."
A=.venv/bin/arborspec
P=.venv/bin/python
RES=benchmarks/results
RUNS=runs/reproduce
MODE=${1:-quick}
shift || true
STEPS=" ${*:-1 2 3 4 5 6 8 9 10 11 12 13 14 16 17 18 19 20 24 28 29 30 31 32} "
[[ $MODE == quick || $MODE == full ]] || { echo "usage: $0 quick|full [STEP ...]" >&2; exit 2; }
mkdir -p "$RES" "$RUNS"
run() { [[ $STEPS == *" $1 "* ]]; }
say() { echo "== $MODE step $1: $2 ($(date -u +%H:%M:%S))" >&2; }
resume() { [[ ${RESUME:-0} == 1 ]] && echo --resume || true; }

# llama-cpp-python in the benchmark's environment, built when missing (~10 min on 2 cores) for AVX-512
# without llama.cpp's AMX kernels: where the CPU reports AMX, a native build's AMX path crashes in its
# first decode.
llama_cpp_python() {
  $P -c "import llama_cpp" 2>/dev/null || CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
    -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON \
    -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \
    .venv/bin/pip install "llama-cpp-python==0.3.36"
}

# bench NAME ARGS...: one `arborspec bench` run into runs/, then its report, summary and the two plots a
# reader looks at into benchmarks/results/NAME/ (the per-step records stay in runs/).
bench() {
  local name=$1
  shift
  [[ ${RESUME:-0} == 1 ]] || rm -rf "$RUNS/$name"
  $A bench --threads 2 --out "$RUNS/$name" $(resume) "$@"
  rm -rf "${RES:?}/$name" && mkdir -p "$RES/$name"
  for f in report.md summary.json speedup_by_category.png speedup_vs_budget.png; do
    [[ -f $RUNS/$name/$f ]] && cp "$RUNS/$name/$f" "$RES/$name/"
  done
  sed -i "s#$RUNS/$name/results.jsonl#$name (per-step records not kept)#" "$RES/$name/report.md"
}

# bench_batch NAME ARGS...: one `arborspec bench-batch` run into runs/, then its report, summary and plot
# into benchmarks/results/NAME/ (the per-run records with every request's tokens stay in runs/).
bench_batch() {
  local name=$1
  shift
  [[ ${RESUME:-0} == 1 ]] || rm -rf "$RUNS/$name"
  $A bench-batch --out "$RUNS/$name" $(resume) "$@"
  rm -rf "${RES:?}/$name" && mkdir -p "$RES/$name"
  for f in report.md summary.json concurrency.png; do
    [[ -f $RUNS/$name/$f ]] && cp "$RUNS/$name/$f" "$RES/$name/"
  done
  sed -i "s#$RUNS/$name/results.jsonl#$name (per-run records not kept)#" "$RES/$name/report.md"
}

# generate_default NAME PROMPTS...: `arborspec generate PROMPT --compare-ar` with no other option, each
# prompt in its own process (as a user runs it), and the mean of the printed speedups.
generate_default() {
  local name=$1 log=$RES/$1.txt
  shift
  : > "$log.tmp"
  for prompt in "$@"; do
    echo "\$ arborspec generate \"$prompt\" --compare-ar" >> "$log.tmp"
    $A generate "$prompt" --compare-ar 2>&1 >/dev/null | sed 's/\x1b\[[0-9;]*m//g' >> "$log.tmp"
  done
  $P - "$log.tmp" <<'EOF' >> "$log.tmp"
import re, statistics, sys
text = open(sys.argv[1]).read()
x = [float(v) for v in re.findall(r"speedup ([0-9.]+)x", text)]
same = text.count("identical tokens")
print(f"speedups {', '.join(f'{v:.2f}x' for v in x)}; mean {statistics.mean(x):.2f}x; "
      f"{same} of {len(x)} outputs identical to plain decoding")
EOF
  mv "$log.tmp" "$log"
  tail -1 "$log" >&2
}

SKY="Explain in a few sentences why the sky is blue."
PROMPTS=("$SKY" "Write a Python function that checks whether a string is a palindrome."
         "Give me three tips for writing a clear email to a busy colleague.")
ALL="-m chain:budget=4:lookup=6 -m specinfer:budget=4:lookup=6 -m sequoia:shape=$RES/sequoia-shape-4.json:lookup=6
  -m opt-tree:budget=4:lookup=6 -m eagle2:budget=4:lookup=6 -m c2t:budget=4:lookup=6 -m dyspec:budget=4:lookup=6
  -m dyspec-threshold:budget=4:lookup=6 -m dyspec:budget=3:lookup=6 -m dyspec:budget=1:lookup=6
  -m dyspec:budget=16"

if [[ $MODE == quick ]]; then
  # 1. int8 target, 8 MT-Bench questions (one per category) x 128 tokens, T = 0: the int8 default, the
  #    float default and the papers' size, against plain decoding and transformers.
  run 1 && say 1 "int8 MT-Bench" && bench quick-mtbench-int8 --dtype int8 --prompts mt-bench \
    --num-prompts 8 --max-new-tokens 128 --temperatures 0 --compare-hf-assisted \
    -m dyspec:budget=1:lookup=6 -m dyspec:budget=3:lookup=6 -m dyspec:budget=16
  # 2. the unmodified float32 model, same prompts: its default against plain float32 decoding.
  run 2 && say 2 "float32 MT-Bench" && bench quick-mtbench-float32 --dtype float32 --prompts mt-bench \
    --num-prompts 8 --max-new-tokens 128 --temperatures 0 -m dyspec:budget=3:lookup=6 -m dyspec:budget=16
  # 3. `arborspec generate --compare-ar` with no other option on three prompts.
  run 3 && say 3 "generate defaults" && generate_default quick-generate-default "${PROMPTS[@]}"
  exit 0
fi

# 1. Sequoia's shape for 4 nodes, from a calibration of the shipped pair (acceptance vector, t(n), c).
if run 1; then
  say 1 "Sequoia calibration and shape"
  $A calibrate --dtype int8 --temperature 0.6 --out "$RUNS/sequoia-calibration.json"
  $A dev sequoia-shape "$RUNS/sequoia-calibration.json" --size 4 --depth 4 --out "$RES/sequoia-shape-4.json"
fi
# 2. The README table: int8 target, 24 MT-Bench questions (3 per category) x 128 tokens, every method at
#    4 draft nodes with context lookup, the int8 CPU default (DySpec 1 + lookup), DySpec 3 + lookup (the
#    float default) and the papers' DySpec 16,
#    T = 0 and 0.6, transformers' generate() and assisted generation beside them.
run 2 && say 2 "int8 MT-Bench, all methods" && bench mtbench-int8 --dtype int8 --prompts mt-bench \
  --num-prompts 24 --max-new-tokens 128 --temperatures 0,0.6 --compare-hf-assisted $ALL
# 3. HumanEval, first 10 problems, every method, T = 0.
run 3 && say 3 "int8 HumanEval, all methods" && bench humaneval-int8 --dtype int8 --prompts humaneval \
  --num-prompts 10 --max-new-tokens 128 --temperatures 0 --compare-hf-assisted $ALL
# 4. The unmodified float32 model on the same MT-Bench selection, T = 0 and 0.6: the default for a
#    DySpec 3 + lookup and the papers' size against plain float32 decoding.
run 4 && say 4 "float32 MT-Bench" && bench mtbench-float32 --dtype float32 --prompts mt-bench \
  --num-prompts 24 --max-new-tokens 128 --temperatures 0,0.6 -m dyspec:budget=3:lookup=6 -m dyspec:budget=16
#    The same weights named by their directory, as a user's own model runs with no option: float32,
#    the n-gram draft (no head beside it) and the device's default tree.
NAMED=${ARBORSPEC_CACHE:-$HOME/.cache/arborspec}/smollm2-135m-instruct
run 4 && say 4 "a named float32 model" && bench mtbench-float32-named --target "$NAMED" \
  --prompts mt-bench --num-prompts 24 --max-new-tokens 128 --temperatures 0
# 5. `arborspec generate --compare-ar` with no other option on three prompts.
run 5 && say 5 "generate defaults" && generate_default generate-default "${PROMPTS[@]}"
# 6. The CPU tree sizes, chosen on the validation slice (never on the benchmark's questions): the int8
#    target's in two runs at T = 0 in opposite method orders and one at T = 0.6; the float targets'
#    (the embedded pair and Gemma 3 in float32) at T = 0.
if run 6; then
  say 6 "tree sizes on the validation slice"
  V="--dtype int8 --prompts mt-bench-validation --num-prompts 20 --max-new-tokens 128"
  bench validation-sizes $V --temperatures 0 -m dyspec:budget=1:lookup=6 -m dyspec:budget=2:lookup=6 \
    -m dyspec:budget=3:lookup=6 -m dyspec:budget=4:lookup=6
  bench validation-sizes-2 $V --temperatures 0 -m dyspec:budget=4:lookup=6 -m dyspec:budget=3:lookup=6 \
    -m dyspec:budget=2:lookup=6 -m dyspec:budget=1:lookup=6
  bench validation-sizes-t06 $V --temperatures 0.6 -m dyspec:budget=1:lookup=6 \
    -m dyspec:budget=2:lookup=6 -m dyspec:budget=3:lookup=6
  F="--dtype float32 --prompts mt-bench-validation --num-prompts 20 --max-new-tokens 128 --temperatures 0"
  F="$F -m dyspec:budget=3:lookup=6 -m dyspec:budget=1,2:lookup=6"
  bench validation-float32-sizes $F
  bench validation-gemma3-sizes $F --target gemma3-270m --draft gemma3-270m-head
fi
# 8. What the int8 target gives up against float32.
run 8 && say 8 "int8 quality" && $P benchmarks/tools/int8_quality.py --out "$RES/int8-quality.json"
# 9. The shipped draft head's held-out quality per tree depth, and its cost.
run 9 && say 9 "draft head quality" && $A draft-quality --draft embedded-head --draft-logits int8 --threads 2 \
  --n-mtbench 20 --n-humaneval 10 --max-new-tokens 128 --out "$RES/head-quality.json"
# 10. 4,096-token generations: identity with plain decoding, both KV caches checked after every step.
run 10 && say 10 "4,096-token runs" && $P benchmarks/tools/long_runs.py --new-tokens 4096 \
  --out "$RES/long-4096.json"
# 11. The randomized soak: 10,000 speculative steps on tiny random pairs, every invariant checked.
run 11 && say 11 "soak" && $A dev soak --steps 10000 --seed 0 --out "$RES/soak-10000.json"
# 12. Gemma 3 270M, the second built-in target (float32, its own tokenizer and sliding window): 16
#     MT-Bench questions (2 per category) x 128 tokens, T = 0, the CPU default tree with its shipped
#     draft head and with the n-gram draft; then two answers of 640 tokens, past its 512-token window.
if run 12; then
  say 12 "Gemma 3 270M"
  G="--target gemma3-270m --dtype float32 --temperatures 0 -m dyspec:budget=3:lookup=6"
  bench gemma3-mtbench-head $G --draft gemma3-270m-head --prompts mt-bench --num-prompts 16 \
    --max-new-tokens 128
  bench gemma3-mtbench-ngram $G --draft ngram --prompts mt-bench --num-prompts 16 --max-new-tokens 128
  bench gemma3-long-head $G --draft gemma3-270m-head --prompts mt-bench --num-prompts 2 \
    --max-new-tokens 640
fi
# 13. Batched decoding with concurrent clients: the int8 target, 16 MT-Bench questions (2 per category) x
#     128 tokens, T = 0, 1-16 clients in a closed loop (all at once, and starting one plain step apart):
#     plain batched decoding, DySpec 1-3 + lookup per request and one node budget over the batch, against
#     plain decoding one request after another.
run 13 && say 13 "concurrency, batched decoding" && bench_batch batch-mtbench-int8 --threads 2 --dtype int8 \
  --prompts mt-bench --num-prompts 16 --max-new-tokens 128 --temperatures 0 --concurrency 1,2,4,8,16 \
  --arrival burst,staggered --sequential -m dyspec:budget=1,2,3:lookup=6 -m shared:max_nodes=8:lookup=6
#     ... and 1 and 4 clients again, with three repeats pooled (single cells of the sweep
#     above vary by up to 25 % from run to run on this machine)
run 13 && bench_batch batch-mtbench-int8-c4 --threads 2 --dtype int8 --prompts mt-bench --num-prompts 16 \
  --max-new-tokens 128 --temperatures 0 --concurrency 1,4 --arrival burst,staggered --sequential --repeats 3 \
  -m dyspec:budget=1,3:lookup=6 -m shared:max_nodes=8:lookup=6
#     ... and 8 clients, three repeats pooled: the shared budget against every fixed budget of the sweep
run 13 && bench_batch batch-mtbench-int8-c8 --threads 2 --dtype int8 --prompts mt-bench --num-prompts 16 \
  --max-new-tokens 128 --temperatures 0 --concurrency 8 --arrival burst,staggered --repeats 3 \
  -m dyspec:budget=1,2,3:lookup=6 -m shared:max_nodes=8:lookup=6
# 14. How often batched greedy decoding on the float32 target equals each request alone.
run 14 && say 14 "float32 batch agreement" && $P benchmarks/tools/batch_agreement.py --dtype float32 \
  --num-prompts 16 --concurrency 8 --out "$RES/batch-agreement-float32.json"
# 16. The server under load: `arborspec serve` on the int8 embedded pair (server defaults: one shared node
#     budget; then per-request trees), 16 MT-Bench questions x 128 tokens, T = 0, streamed by 1, 4 and 16 async `openai`
#     clients in a closed loop; speculative requests against the same server's `speculative: false` ones,
#     interleaved, three repeats. Server and clients share the 2 cores.
serve_load() {
  local name=$1
  shift
  [[ ${RESUME:-0} == 1 ]] || rm -rf "$RUNS/$name"
  $A bench-serve --concurrency 1,4,16 --repeats 3 --num-prompts 16 --max-tokens 128 --temperature 0 \
    --out "$RUNS/$name" $(resume) -- "$@"
  rm -rf "${RES:?}/$name" && mkdir -p "$RES/$name"
  cp "$RUNS/$name/report.md" "$RUNS/$name/summary.json" "$RES/$name/"
}
if run 16; then
  say 16 "server load test"
  serve_load serve-load-int8 --dtype int8
  serve_load serve-load-int8-per-request --dtype int8 --per-request-budget
fi
# 17. Replicas on Ray Serve: one replica with both cores against two replicas of one core each, the same
#     workload as step 16 (speculative requests, the server's defaults), one repeat.
if run 17; then
  say 17 "replicas on Ray Serve"
  for n in 1 2; do
    name=serve-replicas-$n
    [[ ${RESUME:-0} == 1 ]] || rm -rf "$RUNS/$name"
    $A bench-serve --concurrency 1,4,16 --modes speculative --num-prompts 16 --max-tokens 128 --temperature 0 \
      --out "$RUNS/$name" $(resume) -- --dtype int8 --min-replicas $n --max-replicas $n --replica-cpus $((2 / n))
    rm -rf "${RES:?}/$name" && mkdir -p "$RES/$name"
    cp "$RUNS/$name/report.md" "$RUNS/$name/summary.json" "$RES/$name/"
  done
fi
# 18. llama.cpp beside arborspec: its plain decoding of the embedded target's Q4_1 GGUF, timed in the same
#     run as the int8 target's plain decoding and the CPU default (DySpec 1 + lookup) and DySpec 3 + lookup,
#     24 MT-Bench questions x 128 tokens, T = 0 and 0.6. llama-cpp-python is installed into the benchmark's
#     environment first if it is missing (it builds llama.cpp: ~10 min on 2 cores).
if run 18; then
  say 18 "llama.cpp beside arborspec"
  llama_cpp_python
  bench llamacpp-int8 --dtype int8 --prompts mt-bench --num-prompts 24 --max-new-tokens 128 \
    --temperatures 0,0.6 --compare-llama-cpp -m dyspec:budget=1:lookup=6 -m dyspec:budget=3:lookup=6
fi
# 19. Where a forward's time goes, float32 and int8 (eager), 1 / 4 / 16 rows: operators, modules, Python.
run 19 && say 19 "forward profile" && $A dev profile forward --threads 2 --out "$RES/forward-profile.json"
# 20. The sampled trees with context lookup: every method verified by rejection sampling (whose grafted
#     tokens are judged as point-mass candidates, docs/algorithms.md §9), the same 24 MT-Bench questions
#     x 128 tokens at T = 0.6, against plain int8 decoding: the README table's T = 0.6 cells of those methods.
run 20 && say 20 "sampled trees with lookup" && bench mtbench-int8-sampled-lookup --dtype int8 \
  --prompts mt-bench --num-prompts 24 --max-new-tokens 128 --temperatures 0.6 \
  -m chain:budget=4:lookup=6 -m specinfer:budget=4:lookup=6 -m sequoia:shape=$RES/sequoia-shape-4.json:lookup=6 \
  -m dyspec:budget=4:lookup=6 -m dyspec-threshold:budget=4:lookup=6 -m dyspec:budget=3:lookup=6 \
  -m dyspec:budget=1:lookup=6
# 24. Where a single-request speculative step spends its time against a plain token (tree forward,
#     greedy screens or LM-head rows, draft head, the rest), DySpec 1 and 3 + lookup, 8 MT-Bench
#     questions, T = 0 and T = 0.6.
if run 24; then
  say 24 "single-request step split"
  $A dev profile steps --threads 2 -m dyspec:budget=1:lookup=6 -m dyspec:budget=3:lookup=6 \
    --out "$RES/step-split.json"
  $A dev profile steps --threads 2 --temperature 0.6 -m dyspec:budget=1:lookup=6 \
    -m dyspec:budget=3:lookup=6 --out "$RES/step-split-t06.json"
fi
# 28. What a draft of acceptance p would give batched decoding at 4 clients: an oracle draft (the
#     reference token with probability p per position, drafting free) in chains of 1 and 3, beside
#     the shared budget, DySpec 1 + lookup and a chain of 1 from the draft head, plain interleaved.
run 28 && say 28 "oracle drafts" && $P benchmarks/tools/oracle_drafts.py \
  --out "$RES/oracle-drafts.json"
# 29. A user's pair: Qwen2.5-Coder-1.5B-Instruct (int8) with its 0.5B sibling as the draft model
#     (int8 on the CPU, its vocabulary cut), the default (`budget=auto`) beside fixed tree sizes, on
#     HumanEval 20 and the stratified MT-Bench 24; then the n-gram draft on the same target, its
#     default beside auto.
#     Needs the two models' packages (README, "On your own model").
if run 29; then
  say 29 "the Qwen2.5-Coder pair and the n-gram draft on it"
  QWEN="--target qwen2.5-coder-1.5b --max-new-tokens 128 --temperatures 0"
  SIZES="-m dyspec:budget=auto:lookup=6 -m dyspec:budget=1,4:lookup=6"
  bench qwen-pair-humaneval $QWEN --draft qwen2.5-coder-0.5b --prompts humaneval --num-prompts 20 $SIZES
  bench qwen-pair-mtbench $QWEN --draft qwen2.5-coder-0.5b --prompts mt-bench --num-prompts 24 \
    -m dyspec:budget=auto:lookup=6 -m dyspec:budget=1:lookup=6
  NGRAM="-m dyspec:budget=1:lookup=6 -m dyspec:budget=auto:lookup=6"
  bench qwen-ngram-humaneval $QWEN --draft ngram --prompts humaneval --num-prompts 20 $NGRAM
  bench qwen-ngram-mtbench $QWEN --draft ngram --prompts mt-bench --num-prompts 24 $NGRAM
fi
# 30. The Qwen pair beside llama.cpp on the same GGUF files and HumanEval prompts, in one run: the
#     default (int8 target and draft, `budget=auto` + lookup) and plain int8 decoding beside llama.cpp's
#     plain decoding, its prompt-lookup speculation and its speculation with the 0.5B draft's GGUF.
if run 30; then
  say 30 "the Qwen pair beside llama.cpp"
  llama_cpp_python
  bench qwen-llamacpp-humaneval --target qwen2.5-coder-1.5b --max-new-tokens 128 --temperatures 0 \
    --prompts humaneval --num-prompts 20 -m dyspec:budget=auto:lookup=6 --compare-llama-cpp
fi
# 31. The Qwen pair with the float32 target (the draft stays int8, the CPU default for a draft):
#     the default beside plain float32 decoding, HumanEval's first 10 (a float32 1.5B token costs
#     about three int8 ones).
if run 31; then
  say 31 "the Qwen pair, float32 target"
  bench qwen-pair-float32-humaneval --target qwen2.5-coder-1.5b --dtype float32 --max-new-tokens 128 \
    --temperatures 0 --prompts humaneval --num-prompts 10 -m dyspec:budget=auto:lookup=6
fi
# 32. Gemma 3 270M (float32) with its head: the default tree beside fixed sizes and `budget=auto`, on
#     the stratified MT-Bench 24 and HumanEval 20.
if run 32; then
  say 32 "Gemma 3: the default beside fixed sizes"
  G="--target gemma3-270m --dtype float32 --draft gemma3-270m-head --temperatures 0 --max-new-tokens 128"
  S="-m dyspec:budget=3:lookup=6 -m dyspec:budget=1,2,4:lookup=6 -m dyspec:budget=auto:lookup=6"
  bench gemma3-sizes-mtbench $G --prompts mt-bench --num-prompts 24 $S
  bench gemma3-sizes-humaneval $G --prompts humaneval --num-prompts 20 $S
fi
# 15 (only with a GPU, not in the default steps): the CUDA tests, the embedded pair's bench and
#     bench-batch on the GPU, with the script's defaults (benchmarks/results/gpu-h100/).
run 15 && say 15 "GPU tests and bench" && benchmarks/tools/gpu_run.sh "$RUNS/gpu"
exit 0
