# Every target sets itself up from a fresh clone: the venv and pinned installs come first.
#   make test                 lint + the whole suite on the newest Airflow line (3.3)
#   make test AIRFLOW=3.0     the same on another supported line (its own venv and constraints)
#   make smoke AIRFLOW=3.1    the smoke set CI runs on each non-default line
#   make check-constraints    Python 3.12 sets resolve; the provider installs into every managed image set
#   make docs                 the docs site (docs/, mkdocs.yml), strict: broken links and anchors fail
#   make test-lineage         the OpenLineage tests, in a venv with the [openlineage] extra (newest line)
#   make bench-compare BASE=ref   part 1 of the bench, a commit against this tree, interleaved (docs/benchmarks.md)
#   make provider-info        rewrite _provider_info_derived.py (the provider metadata's derived literals)
PYTHON ?= python3
AIRFLOW_LINES := 3.0 3.1 3.2 3.3
NEWEST := 3.3
AIRFLOW ?= $(NEWEST)
ifeq ($(filter $(AIRFLOW),$(AIRFLOW_LINES)),)
$(error AIRFLOW=$(AIRFLOW) is not a supported line; use one of: $(AIRFLOW_LINES))
endif
PYVER := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
CONSTRAINTS := constraints/constraints-airflow-$(AIRFLOW)-py$(PYVER).txt
# One venv per constraints set, reused by every target on that line: .venv for the newest line.
VENV := $(if $(filter $(NEWEST),$(AIRFLOW)),.venv,.venv-airflow-$(AIRFLOW))
BIN := $(VENV)/bin
# The older lines' venvs (the smoke sets) hold the [openlineage] extra at the versions their managed images ship
# (pinned in their constraints), so their smoke sets run the lineage tests, required; the newest line's .venv
# stays without it, as the main suite checks that nothing changes without OpenLineage (docs/lineage.md).
ifeq ($(AIRFLOW),$(NEWEST))
DEV_EXTRAS := dev
SMOKE_ENV :=
else
DEV_EXTRAS := dev,openlineage
SMOKE_ENV := ETL_CRAFT_REQUIRE_OPENLINEAGE=1
endif

.PHONY: demo test test-lineage smoke lint bench bench-compare docs check-constraints provider-info system-deps vendor-ui clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade "pip>=24"

$(VENV)/.installed: $(BIN)/python pyproject.toml $(CONSTRAINTS)
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e '.[examples]'
	touch $@

$(VENV)/.installed-dev: $(BIN)/python pyproject.toml $(CONSTRAINTS)
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e '.[$(DEV_EXTRAS)]'
	touch $@ $(VENV)/.installed

$(CONSTRAINTS):
	@echo "error: no pinned constraints for Airflow $(AIRFLOW) on Python $(PYVER) ($@); supported: Python 3.11 and 3.12" >&2; exit 2

demo: $(VENV)/.installed
	$(BIN)/python -m airflow_provider_etl_craft.example_dags.demo

test: lint system-deps
	$(BIN)/python -m pytest -q --durations=25

# System pieces of the test tiers, from Debian's packages: PgBouncer (pooler tier), socat, redis-server
# and iproute2 (several-machines tier), chromium (web tier's browser, driven headless by playwright). As
# root, install what is missing; otherwise those tiers skip (or fail under ETL_CRAFT_REQUIRE_PGBOUNCER=1 /
# ETL_CRAFT_REQUIRE_MACHINES=1 / ETL_CRAFT_REQUIRE_BROWSER=1, as in CI).
SYSTEM_TOOLS := pgbouncer:pgbouncer socat:socat redis-server:redis-server ip:iproute2 chromium:chromium
system-deps:
	@missing=""; for pair in $(SYSTEM_TOOLS); do \
		tool=$${pair%%:*}; pkg=$${pair##*:}; \
		command -v $$tool >/dev/null || test -x /usr/sbin/$$tool || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null; \
		else echo "not installed:$$missing (apt-get install$$missing): the tiers that need them will skip" >&2; fi; \
	fi

# The smoke set: what differs by Airflow line (the task runner, deferral, rescheduling, mapping, skips, the
# plugin, OpenLineage's releases) on real DAGs. Its dag.test() pipelines run on a SQLite Engine DB only: the
# Engine side of a pipeline does not change with the Airflow line, and PostgreSQL on each line is still driven
# by the smoke set's hook, migration, trigger, metrics and web-tier tests.
smoke: $(VENV)/.installed-dev
	$(SMOKE_ENV) $(BIN)/python -m pytest -q -m 'smoke and not (e2e and postgres)'

# OpenLineage is optional: the main venv (and `make test`) runs without it, which shows that nothing changes
# without it; this tier installs the [openlineage] extra from the same pinned set into a venv of its own and runs
# the lineage tests, which must not skip there (docs/lineage.md).
LINEAGE_VENV := .venv-openlineage
$(LINEAGE_VENV)/.installed: pyproject.toml constraints/constraints-airflow-$(NEWEST)-py$(PYVER).txt
	$(PYTHON) -m venv $(LINEAGE_VENV)
	$(LINEAGE_VENV)/bin/pip install -q --upgrade "pip>=24"
	$(LINEAGE_VENV)/bin/pip install -q -c constraints/constraints-airflow-$(NEWEST)-py$(PYVER).txt -e '.[dev,openlineage]'
	touch $@

test-lineage: $(LINEAGE_VENV)/.installed system-deps
	ETL_CRAFT_REQUIRE_OPENLINEAGE=1 $(LINEAGE_VENV)/bin/python -m pytest -q tests/unit/test_lineage.py tests/e2e/test_lineage.py \
		tests/deployment/test_lineage_deployment.py

# Bookkeeping cost, contention and Airflow overhead; prints a table, writes bench/results.json. Part 10 (the
# OpenLineage cost per task) runs in the lineage venv, built first. Extra options: make bench BENCH_ARGS="--quick"
# (see python -m bench --help).
bench: $(VENV)/.installed-dev $(LINEAGE_VENV)/.installed
	$(BIN)/python -m bench $(BENCH_ARGS)

# Part 1's step times of BASE (a git ref, in a throwaway worktree) against this tree, ROUNDS interleaved bench
# runs each (default 8; a round takes about 2 min here); prints the table, writes bench/compare-results.json, exits 1 when
# a step is more than 5% slower beyond the noise. Extra options: COMPARE_ARGS="--runs 10" (python -m bench.compare -h).
ifneq ($(filter bench-compare,$(MAKECMDGOALS)),)
ifeq ($(BASE),)
$(error usage: make bench-compare BASE=<git ref> [ROUNDS=n])
endif
endif
bench-compare: $(VENV)/.installed-dev
	$(BIN)/python -m bench.compare --base "$(BASE)" $(if $(ROUNDS),--rounds $(ROUNDS)) $(COMPARE_ARGS)

# The docs site (mkdocs.yml; pages in docs/) built strict: a broken link or anchor, or a page left out of the
# navigation, fails the build. Its own venv, pinned by constraints/constraints-docs.txt.
DOCS_VENV := .venv-docs
$(DOCS_VENV)/.installed: constraints/constraints-docs.txt
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/pip install -q -c constraints/constraints-docs.txt mkdocs mkdocs-material
	touch $@

docs: $(DOCS_VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict --quiet

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check airflow_provider_etl_craft tests bench harness tools
	$(BIN)/ruff format --check airflow_provider_etl_craft tests bench harness tools
	$(BIN)/mypy

provider-info: $(VENV)/.installed-dev
	$(BIN)/python tools/provider_info.py

check-constraints: $(VENV)/.installed-dev
	$(BIN)/python tools/constraints.py check

# The plugin UI's charting library (uPlot), vendored: fetch the pinned release from the npm registry, check its
# integrity hash and each file's, write it under airflow_provider_etl_craft/plugins/ui/vendor/ (docs/ui.md).
vendor-ui:
	$(PYTHON) tools/vendor_uplot.py fetch

clean:
	rm -rf .venv .venv-airflow-* .venv-docs .venv-openlineage .site .demo build dist *.egg-info
