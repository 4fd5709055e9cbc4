# Every target sets itself up from a fresh clone: the venv and pinned installs come first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYVER := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
CONSTRAINTS := constraints/constraints-py$(PYVER).txt

.PHONY: demo test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade "pip>=24"

$(VENV)/.installed: $(BIN)/python pyproject.toml $(CONSTRAINTS)
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e '.[examples]'
	touch $@

$(VENV)/.installed-dev: $(BIN)/python pyproject.toml $(CONSTRAINTS)
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e '.[dev]'
	touch $@ $(VENV)/.installed

constraints/constraints-py%.txt:
	@echo "error: no pinned constraints for Python $*; run with Python 3.11 (make PYTHON=python3.11 ...)" >&2; exit 2

demo: $(VENV)/.installed
	$(BIN)/python -m airflow_provider_etl_craft.example_dags.demo

test: lint
	$(BIN)/python -m pytest -q

# Bookkeeping cost, contention and Airflow overhead; prints a table, writes bench/results.json.
# Extra options: make bench BENCH_ARGS="--quick" (see python -m bench --help).
bench: $(VENV)/.installed-dev
	$(BIN)/python -m bench $(BENCH_ARGS)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check airflow_provider_etl_craft tests bench
	$(BIN)/ruff format --check airflow_provider_etl_craft tests bench

clean:
	rm -rf $(VENV) .demo build dist *.egg-info
