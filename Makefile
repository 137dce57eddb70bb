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

$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,bench]'
	touch $(BENCH_STAMP)

demo: $(STAMP)
	$(BIN)/asyncloader demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest

# The suite against torch DataLoader and SPDL (about 21 minutes here); it rewrites the
# generated part of docs/performance.md. The design measurements behind FileDataset and the
# collator are separate: benches/bench_datasets.py and benches/bench_images.py.
bench: $(BENCH_STAMP)
	$(BIN)/python benches/suite.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache

soak: $(STAMP)
	$(BIN)/python benches/soak.py
