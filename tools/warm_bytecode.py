"""Bytecode caches written once before `make test`'s suite, instead of once per xdist worker.

In a fresh clone no `__pycache__/` exists yet. The four xdist workers start together,
each imports every test module, and each finds no cache: each rewrites the assertions of
every test module itself (pytest's import hook, about 5 CPU s a worker on this suite)
and compiles the project's modules. That made a fresh clone's collection 12.6 s instead
of 3.2 s. Here it happens once, in two processes: the project's and the tests' ordinary
`.pyc` files (compileall), and for each module pytest rewrites (every `conftest.py`,
every module named like a test file) the `.pyc` pytest's hook would write, from
pytest's own functions. The hook finds it valid (source size and mtime) and only reads it.

The rewrite functions are pytest's internals: if they are gone (another pytest), this
says so and writes only the ordinary caches; the suite rewrites as before. The code in
a cache is what pytest's hook would have made (the same functions; the one setting
that changes a rewrite, the assertion pass hook, leaves the rewrites to pytest), and a
cache the hook does not find valid it writes again.

    .venv/bin/python tools/warm_bytecode.py
"""

from __future__ import annotations

import ast
import compileall
import fnmatch
import os
import sys
import tomllib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import SimpleNamespace

try:  # pytest's internals: see the docstring
    from _pytest.assertion import rewrite as _rewrite
except ImportError:  # pragma: no cover
    _rewrite = None  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("config", "core", "jobs", "audit", "dlq", "tenants", "tests", "tools")
# pytest's default python_files; pyproject.toml sets none.
TEST_FILES = ("test_*.py", "*_test.py")
WORKERS = 2


def rewritten(name: str) -> bool:
    """Whether pytest's import hook rewrites a module of this file name."""
    return name == "conftest.py" or any(fnmatch.fnmatch(name, p) for p in TEST_FILES)


class _Rewritten:
    """compileall's `rx` (it calls `search` with each path): the modules pytest's hook
    rewrites are left out of the ordinary caches, which nothing would read."""

    @staticmethod
    def search(path: str) -> bool:
        return rewritten(os.path.basename(path))


def rewritten_modules(root: Path = ROOT) -> list[Path]:
    """The modules pytest's import hook rewrites, every package's."""
    return [
        path
        for package in PACKAGES
        for path in sorted((root / package).rglob("*.py"))
        if rewritten(path.name)
    ]


def _pass_hook_enabled(root: Path) -> bool:
    # The one ini value that changes a rewrite (the assertion pass hook): with it, the
    # rewrite is left to pytest's hook, which reads the configuration.
    options = tomllib.loads((root / "pyproject.toml").read_text())
    ini = options.get("tool", {}).get("pytest", {}).get("ini_options", {})
    return bool(ini.get("enable_assertion_pass_hook"))


def warm_rewrite(path: Path) -> bool:
    """Write the rewritten `.pyc` of `path` where pytest's hook looks; False when a
    valid one is there already."""
    cache_dir = _rewrite.get_cache_dir(path)
    pyc = cache_dir / (path.name[:-3] + _rewrite.PYC_TAIL)
    if _rewrite._read_pyc(path, pyc) is not None:
        return False
    cache_dir.mkdir(parents=True, exist_ok=True)
    stat = os.stat(path)
    source = path.read_bytes()
    tree = ast.parse(source, filename=str(path))
    _rewrite.rewrite_asserts(tree, source, str(path), None)
    code = compile(tree, str(path), "exec", dont_inherit=True)
    state = SimpleNamespace(trace=lambda message: None)  # what _write_pyc reports to
    return _rewrite._write_pyc(state, code, stat, pyc)  # type: ignore[arg-type]


def _rewrite_available() -> str | None:
    """Why pytest's rewrite cannot be used here, or None."""
    if _rewrite is None:
        return "pytest is not installed"
    for name in ("PYC_TAIL", "_read_pyc", "_write_pyc", "get_cache_dir", "rewrite_asserts"):
        if not hasattr(_rewrite, name):
            return f"_pytest.assertion.rewrite has no {name}"
    return None


def main() -> int:
    if sys.dont_write_bytecode:
        print("warm_bytecode: PYTHONDONTWRITEBYTECODE is set, nothing written")
        return 0
    for package in PACKAGES:
        compileall.compile_dir(str(ROOT / package), rx=_Rewritten, quiet=2, workers=WORKERS)
    missing = _rewrite_available()
    if missing:
        print(f"warm_bytecode: {missing}; ordinary caches only")
        return 0
    if _pass_hook_enabled(ROOT):
        print("warm_bytecode: enable_assertion_pass_hook is set; rewrites left to pytest")
        return 0
    modules = rewritten_modules()
    with ProcessPoolExecutor(WORKERS) as pool:
        written = sum(pool.map(warm_rewrite, modules, chunksize=8))
    print(f"warm_bytecode: {written} of {len(modules)} rewritten test modules written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
