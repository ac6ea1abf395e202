#!/usr/bin/env bash
# The upgrade check of issue 38 (docs/development.md#checks-against-an-older-release):
# a database whose audit chains an older release (START, default the start commit
# c940624) wrote migrates to this checkout, verify_audit_chain exits 0, this checkout
# appends to the same chains (the old release's waiting jobs moved on, new jobs singly
# and in batches), and verify_audit_chain exits 0 again, its old checkpoint expected.
# Between the two, the old release's code writes once more on the migrated database,
# as a rolling upgrade's old processes do (ROLLING=0 leaves that step out).
#
# Runs in a scratch database beside DATABASE_URL's (<name>_upgrade, dropped before and
# after) with this checkout's .venv for both trees (the old tree's packages are found
# first: manage.py's own directory leads sys.path). Usage:
#   tools/upgrade_check.sh [START]        or        make upgrade-check [START=<commit>]
set -euo pipefail

START=${1:-${START:-c940624}}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$HERE/.venv/bin/python}
export DEBUG=${DEBUG:-true}
BASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/jobops}
export DATABASE_URL="${BASE_URL%/*}/$(basename "${BASE_URL%%\?*}")_upgrade"
SCRATCH_DB=$(basename "$DATABASE_URL")
ADMIN_URL="${BASE_URL%/*}/postgres"

OLD=$(mktemp -d "${TMPDIR:-/tmp}/jobops-upgrade.XXXXXX")
drop_db() { psql -q "$ADMIN_URL" -c "DROP DATABASE IF EXISTS \"$SCRATCH_DB\" WITH (FORCE)"; }
cleanup() { drop_db || true; rm -rf "$OLD"; }
trap cleanup EXIT

step() { printf '\n== upgrade check: %s\n' "$*"; }
writes() {  # $1: the tree whose code writes, $2: old or new
  (cd "$1" && UPGRADE_PHASE=$2 "$PY" manage.py shell -c \
    "import runpy; runpy.run_path('$HERE/tools/upgrade_writes.py', run_name='__main__')")
}

step "the start tree $START into $OLD, scratch database $SCRATCH_DB"
git -C "$HERE" archive "$START" | tar -x -C "$OLD"
drop_db

step "migrate with $START and write chains with its code"
(cd "$OLD" && "$PY" manage.py ensure_database && "$PY" manage.py migrate --noinput -v 0)
old_out=$(writes "$OLD" old)
echo "$old_out"
old_checkpoint=$(echo "$old_out" | sed -n 's/^checkpoint //p')

step "migrate with this checkout ($(git -C "$HERE" rev-parse --short HEAD)$(git -C "$HERE" diff --quiet HEAD || echo '+changes'))"
(cd "$HERE" && "$PY" manage.py migrate --noinput -v 0)

step "verify the chains the start commit wrote"
(cd "$HERE" && "$PY" manage.py verify_audit_chain --expect-checkpoint "$old_checkpoint")

if [ "${ROLLING:-1}" != 0 ]; then
  step "a rolling upgrade: $START's code writes on the migrated database"
  writes "$OLD" rolling
fi

step "append to the same chains with this checkout"
writes "$HERE" new

step "verify again"
(cd "$HERE" && "$PY" manage.py verify_audit_chain --expect-checkpoint "$old_checkpoint")

step "passed: chains written by $START verify after the upgrade and after new appends"
