# Sourced by every benchmarks/reproduce-*.sh: strict mode, the tools, where figures go, the default sizes, and
# `run N` (true when step N is in $STEPS, which a script sets after sourcing this file).
set -euo pipefail
A=.venv/bin/arborspec
P=.venv/bin/python
OUT=benchmarks
MT=${MT:-20}        # MT-Bench first turns
N=${N:-128}         # new tokens per generation
run() { [[ " ${STEPS:-} " == *" $1 "* ]]; }
