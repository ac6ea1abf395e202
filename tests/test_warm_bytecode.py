"""tools/warm_bytecode.py: the rewritten caches it writes before `make test`'s suite are the
ones pytest reads, and the assertions in them still explain a failure."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.processes import ROOT


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "warm_bytecode", ROOT / "tools" / "warm_bytecode.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_it_lists_the_modules_pytest_rewrites_and_not_the_helpers(
    request: pytest.FixtureRequest,
):
    modules = set(_tool().rewritten_modules())
    collected = {Path(item.path) for item in request.session.items}
    assert collected <= modules  # every module this run collected (make test: all of them)
    assert ROOT / "tests" / "conftest.py" in modules
    assert ROOT / "tests" / "browser" / "conftest.py" in modules
    assert ROOT / "tests" / "processes.py" not in modules  # imported plainly, not rewritten


def test_pytest_reads_the_warmed_cache_and_its_assert_still_explains(tmp_path: Path):
    sample = tmp_path / "test_sample.py"
    sample.write_text("def test_sum():\n    total = sum([1, 2])\n    assert total == 4\n")
    tool = _tool()
    assert tool.warm_rewrite(sample) is True
    assert tool.warm_rewrite(sample) is False  # valid already: left as it is
    (pyc,) = (tmp_path / "__pycache__").glob("test_sample.*-pytest-*.pyc")
    written = pyc.stat().st_mtime_ns

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(sample)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "assert 3 == 4" in result.stdout  # the rewritten assert, values shown
    assert pyc.stat().st_mtime_ns == written  # read, not rewritten again


def test_a_changed_module_is_warmed_again(tmp_path: Path):
    sample = tmp_path / "test_changed.py"
    sample.write_text("def test_one():\n    assert 1\n")
    tool = _tool()
    assert tool.warm_rewrite(sample) is True
    sample.write_text("def test_one():\n    assert 1 == 1  # longer now\n")
    assert tool.warm_rewrite(sample) is True  # its size changed: the cache is stale
