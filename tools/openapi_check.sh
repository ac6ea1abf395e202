#!/usr/bin/env bash
# The OpenAPI byte-identity check of issue 38
# (docs/development.md#checks-against-an-older-release): `manage.py spectacular` of an
# older release (START, default the start commit c940624) and of this working tree,
# compared with cmp. Prints both files' sha256; exits 0 when they are byte-identical,
# 1 (with a diff) when not.
#   tools/openapi_check.sh [START]        or        make openapi-check [START=<commit>]
# OUT=<dir> keeps both schema files there (default: a temporary directory, removed).
set -euo pipefail

START=${1:-${START:-c940624}}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$HERE/.venv/bin/python}
export DEBUG=${DEBUG:-true}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/jobops-openapi.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
OUT=${OUT:-$WORK}
mkdir -p "$OUT" "$WORK/old"

git -C "$HERE" archive "$START" | tar -x -C "$WORK/old"
# Each tree's own manage.py: its directory leads sys.path, so its own packages load.
(cd "$WORK/old" && "$PY" manage.py spectacular --file "$OUT/openapi-$START.yaml")
(cd "$HERE" && "$PY" manage.py spectacular --file "$OUT/openapi-worktree.yaml")

sha256sum "$OUT/openapi-$START.yaml" "$OUT/openapi-worktree.yaml"
if cmp "$OUT/openapi-$START.yaml" "$OUT/openapi-worktree.yaml"; then
  echo "openapi check: the schema is byte-identical to $START's"
else
  diff -u "$OUT/openapi-$START.yaml" "$OUT/openapi-worktree.yaml" | head -200 || true
  echo "openapi check: the schema differs from $START's" >&2
  exit 1
fi
