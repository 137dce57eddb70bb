# The two commands of the quick start: `make demo` and `make test`. Both build .venv on a
# fresh machine that has only Python 3 and make.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench soak clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/asyncloader demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python benches/bench_overhead.py
	$(BIN)/python benches/bench_latency.py
	$(BIN)/python benches/bench_datasets.py
	$(BIN)/python benches/bench_images.py
	$(BIN)/python benches/bench_peers.py
	$(BIN)/python benches/plots.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache

soak: $(STAMP)
	$(BIN)/python benches/soak.py
