"""The import structure of docs/architecture.md#layers, held by tests (issue 8).

1. import-linter's contracts (pyproject.toml): the apps import downward only
   (config > dlq > jobs > audit > core), and inside jobs its packages do too
   (docs/architecture.md#inside-jobs); the publisher is transport only, services
   never import an API, a task or the admin.
2. No function-level import from another project package: such an import hides a
   dependency (often a cycle) from readers and from import-linter's layers alike.
3. jobs/ keeps at its top level only its entry points and the re-exports at former
   documented paths, and those re-export and define nothing.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

from tests.processes import ROOT

PACKAGES = ("config", "core", "audit", "jobs", "dlq")


def test_the_import_contracts_hold():
    result = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "lint-imports"), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def _function_level_imports(path: Path) -> list[tuple[int, str]]:
    found = []
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.ImportFrom) and inner.module and inner.level == 0:
                found.append((inner.lineno, inner.module))
            elif isinstance(inner, ast.Import):
                found += [(inner.lineno, alias.name) for alias in inner.names]
    return found


def test_no_function_level_import_crosses_a_package():
    crossing = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for line, module in _function_level_imports(path):
                top = module.split(".")[0]
                if top in PACKAGES and top != package:
                    crossing.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert crossing == []


def test_the_structure_check_sees_a_function_level_import(tmp_path):
    # The check above must not pass vacuously: it finds a crossing import when one exists.
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from dlq.services import x\n    return x\n")
    assert _function_level_imports(sample) == [(2, "dlq.services")]


# jobs/ holds packages (docs/architecture.md#inside-jobs); at its top level only what
# Django, the migrations and Celery look for there, and the re-exports kept at former
# documented paths.
JOBS_TOP_LEVEL = {"__init__", "apps", "models", "artefact_storage", "queries", "controls", "tasks"}
JOBS_REEXPORTS = {"errors", "states", "dispatcher", "events", "liveness", "runtime", "executor"}


def test_jobs_top_level_holds_only_its_entry_points_and_reexports():
    found = {path.stem for path in (ROOT / "jobs").glob("*.py")}
    assert found == JOBS_TOP_LEVEL | JOBS_REEXPORTS


def test_a_reexport_at_a_former_path_defines_nothing():
    # A re-export that grew a definition of its own would be a second home for it.
    for name in sorted(JOBS_REEXPORTS):
        tree = ast.parse((ROOT / "jobs" / f"{name}.py").read_text())
        kinds = {type(node).__name__ for node in tree.body}
        assert kinds <= {"Expr", "ImportFrom", "Assign"}, (name, kinds)
        assigned = [
            target.id
            for node in tree.body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        ]
        assert assigned == ["__all__"], name
        imported = [node.module for node in tree.body if isinstance(node, ast.ImportFrom)]
        assert imported and all(module.startswith("jobs.") for module in imported), name
