#!/usr/bin/env bash
# `make test` (docs/testing.md): the checks, the database tests on PostgreSQL, every other
# test in parallel, then the `serial` ones alone. The checks and the database tests run
# beside the parallel run, in the time its end-to-end tests spend waiting on the processes
# they start (about a fifth of two cores); their output is printed when they end. Any
# failure fails the whole; the serial tests run only when everything before passed.
#
# From the Makefile, which sets: VENV, PARALLEL_ARGS (xdist options without -n),
# MAIN_WORKERS, DB_WORKERS, DB_TESTS, SERIAL_TESTS.
set -uo pipefail
cd "$(dirname "$0")/.."

PY="$VENV/bin/python"
logs=$(mktemp -d "${TMPDIR:-/tmp}/iop-make-test.XXXXXX")
trap 'rm -rf "$logs"' EXIT

checks() {
    "$PY" manage.py check &&
        "$PY" manage.py makemigrations --check --dry-run &&
        "$VENV/bin/ruff" check . &&
        "$VENV/bin/mypy" &&
        "$VENV/bin/lint-imports"
}

bash scripts/install-clients.sh || true
eval "$("$PY" scripts/test_services.py)"

checks >"$logs/checks.log" 2>&1 &
checks_pid=$!
db_pid=
if [ -n "${IOP_TEST_DATABASE_URL:-}" ]; then
    echo "database tests on ${IOP_TEST_DATABASE_URL%%@*}@... (printed when they end)"
    # shellcheck disable=SC2086  # DB_TESTS is a list of paths
    DATABASE_URL="$IOP_TEST_DATABASE_URL" "$VENV/bin/pytest" -q -n "$DB_WORKERS" \
        $PARALLEL_ARGS $DB_TESTS >"$logs/db.log" 2>&1 &
    db_pid=$!
fi

# shellcheck disable=SC2086
"$VENV/bin/pytest" -n "$MAIN_WORKERS" $PARALLEL_ARGS -m "not serial"
status=$?

wait "$checks_pid"
checks_status=$?
echo "== checks (manage.py check, makemigrations --check, ruff, mypy, lint-imports)"
cat "$logs/checks.log"
[ "$checks_status" -eq 0 ] || status=$checks_status
if [ -n "$db_pid" ]; then
    wait "$db_pid"
    db_status=$?
    echo "== database tests on PostgreSQL"
    cat "$logs/db.log"
    [ "$db_status" -eq 0 ] || status=$db_status
fi

if [ "$status" -eq 0 ] && [ -n "$SERIAL_TESTS" ]; then
    # shellcheck disable=SC2086
    "$VENV/bin/pytest" -m serial $SERIAL_TESTS
    status=$?
    if [ "$status" -eq 5 ]; then status=0; fi  # none selected
fi
echo "$IOP_TEST_SKIPPED"
exit "$status"
