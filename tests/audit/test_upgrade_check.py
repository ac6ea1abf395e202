"""The upgrade check of issue 38 (docs/development.md#checks-against-an-older-release)
as a heavy test: chains the start commit wrote migrate, verify, take this checkout's
appends (and a rolling upgrade's old process's) and verify again.

`make upgrade-check` runs the same script on its own; here it runs in `make
test-heavy`, so that `.ci/run` proves it on every change. It uses the checkout's git
history (the start commit's tree) and a scratch database beside DATABASE_URL's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
START = "c940624"


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
    )


@pytest.mark.heavy
def test_chains_the_start_commit_wrote_verify_after_the_upgrade_and_new_appends():
    if _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout: the start commit's tree cannot be read")
    assert _git("cat-file", "-e", f"{START}^{{commit}}").returncode == 0, (
        f"the start commit {START} is not in this clone's history (a shallow clone?)"
    )
    # The settings `make upgrade-check` runs with, not this session's test settings.
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [str(ROOT / "tools" / "upgrade_check.sh"), START],
        cwd=ROOT,
        env={**env, "PY": sys.executable},
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert output.count("Audit trail intact") == 2, output[-6000:]
    assert "passed: chains written by" in done.stdout
