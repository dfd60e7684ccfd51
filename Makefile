# IOP Edge — two commands: `make run` and `make test` (and `make test-fast` for the inner loop).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BASE_STAMP := $(VENV)/.installed-base
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: run test test-fast lint bench bench-pool smoke clean

$(BASE_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[edge]'
	@touch $@

$(DEV_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[edge,dev]'
	@touch $@ $(BASE_STAMP)

run: $(BASE_STAMP)
	$(PY) scripts/run_local.py

# PostgreSQL and Redis on their default local ports are used when they answer (as .ci/run
# does; an IOP_TEST_* variable already set wins): scripts/test_services.py. The database
# tests run again on that PostgreSQL; the last line says which groups skipped and why.
# Only in-process tests: an end-to-end module's Edges keep their own SQLite whatever
# DATABASE_URL says, so running one again here would repeat it.
DB_TESTS := $(filter-out %_e2e.py,$(wildcard tests/test_catalog_*.py tests/test_iop_*.py \
	tests/test_metering_*.py)) \
	tests/test_refresh_services.py tests/test_refresh_api.py tests/test_refresh_apply_live.py \
	tests/test_refresh_api_access.py tests/test_refresh_apply_atomic.py tests/test_rest_api_fuzz.py \
	tests/test_admin_login_throttle.py tests/test_status_views.py \
	tests/test_usage_chart.py tests/test_revision_propagation.py tests/test_managed_catalog.py

# Tests run in parallel (pytest-xdist). --dist loadfile keeps each module on one worker, so a
# module's shared Stack starts once; --no-loadscope-reorder hands modules out in collection
# order, longest first (tests/conftest.py, tests/module_times.json). `make test` runs one
# worker more than there are cores: its end-to-end tests spend about a third of their time
# waiting on the processes they start, which a third worker fills on 2 cores; the database
# tests and `make test-fast` (in-process, CPU-bound) run one per core. TEST_WORKERS=N sets
# all three. Tests marked `serial` (they measure latency) run afterwards, alone, from the
# modules that hold one (exit 5: none was selected). docs/testing.md says what runs where.
CORES := $(shell nproc 2>/dev/null || echo 2)
TEST_WORKERS ?=
PARALLEL = -n $(or $(TEST_WORKERS),$(1)) --dist loadfile --no-loadscope-reorder
SERIAL_TESTS := $(shell grep -rl --include='test_*.py' 'mark\.serial' tests)
# Bytecode caches on for the test targets even where the environment turns them off: without
# them every run rewrites the asserts of ~200 test modules and compiles the project again in
# each worker and child process (about a minute of CPU). __pycache__ is ignored by git.
test test-fast: export PYTHONDONTWRITEBYTECODE :=

test: $(DEV_STAMP)
	@# the documented installs' wheels, fetched beside the checks (tests/support/wheelhouse.py)
	@$(PY) -m tests.support.wheelhouse > /dev/null 2>&1 &
	@# manage.py check, makemigrations --check, ruff, lint-imports beside mypy; the agents' CLIs
	$(PY) scripts/checks.py
	@eval "$$($(PY) scripts/test_services.py)"; status=0; \
	if [ -n "$$IOP_TEST_DATABASE_URL" ]; then \
		echo "database tests on $${IOP_TEST_DATABASE_URL%%@*}@..."; \
		DATABASE_URL="$$IOP_TEST_DATABASE_URL" $(VENV)/bin/pytest -q $(call PARALLEL,$(CORES)) \
			$(DB_TESTS) || status=$$?; \
	fi; \
	if [ $$status -eq 0 ]; then \
		$(VENV)/bin/pytest $(call PARALLEL,$(shell expr $(CORES) + 1)) -m "not serial" || status=$$?; \
	fi; \
	if [ $$status -eq 0 ] && [ -n "$(SERIAL_TESTS)" ]; then \
		$(VENV)/bin/pytest -m serial $(SERIAL_TESTS) || status=$$?; \
	fi; \
	if [ $$status -eq 5 ]; then status=0; fi; \
	echo "$$IOP_TEST_SKIPPED"; exit $$status

# The inner loop: unit and in-process tests (nothing marked `slow`: no real process, no
# browser), property tests on a tenth of their examples (IOP_TEST_FAST, tests/support/
# examples.py), in about a minute. Not a substitute for `make test`.
test-fast: $(DEV_STAMP)
	IOP_TEST_FAST=1 $(VENV)/bin/pytest -q $(call PARALLEL,$(CORES)) -m "not slow and not serial"

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

bench-pool: $(DEV_STAMP)
	$(PY) scripts/bench_pool.py

bench: $(DEV_STAMP)
	$(PY) scripts/bench.py $(ARGS)

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache .mypy_cache .hypothesis
