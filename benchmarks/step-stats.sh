#!/usr/bin/env bash
# Per-step statistics (draft forwards, build time, calibrated vs actual accepted length by step) of the committed
# results files that README, benchmarks/README.md and docs/algorithms.md quote; writes benchmarks/step-stats.md.
#   benchmarks/step-stats.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
git show 0e02a54:benchmarks/estimate-ngram/results.jsonl > "$tmp/estimate-ngram-0e02a54.jsonl"
{
  echo "# Per-step statistics of committed bench results"
  echo
  echo "Written by \`benchmarks/step-stats.sh\` (\`benchmarks/step_stats.py\` on each file); read from the files, not timed."
  echo
  "$PY" benchmarks/step_stats.py "$tmp/estimate-ngram-0e02a54.jsonl" \
      --label "estimate-ngram as of 0e02a54 (before carrying the acceptance model between generations)"
  for d in estimate-ngram int8-head-mtbench-t0 auto-mtbench-t06 prefetch-all-int8-t0 int8-head-mtbench-t0-s9-before \
      int8-head-mtbench-t0-s9 int8-head-mtbench-t06-s9 ${EXTRA_DIRS:-}; do
    echo; "$PY" benchmarks/step_stats.py "benchmarks/$d/results.jsonl" --label "$d"
  done
} > benchmarks/step-stats.md.tmp
mv benchmarks/step-stats.md.tmp benchmarks/step-stats.md
echo "wrote benchmarks/step-stats.md"
