"""The payload version of a job message, for rolling upgrades (docs/operations/upgrading.md).

Every message the publisher sends carries `"v": PAYLOAD_VERSION` in its payload. A
worker reads its own version and the one before, so workers of release N run beside
dispatchers of release N - 1 and N during an upgrade; a message published before
payloads had a version (no `v`) counts as the previous version. Anything else (a
version from a newer release, or not a version at all) is refused before the claim:
the job fails with an `UNSUPPORTED_VERSION` dead letter, never inside its handler.

Raise PAYLOAD_VERSION when a release changes what a worker must read from the payload
in a way the previous worker could not, and keep reading the old shape for one release.
"""

from __future__ import annotations

from typing import Any

PAYLOAD_VERSION = 2
# What this worker reads: its own version and the previous one.
READABLE_VERSIONS = frozenset({PAYLOAD_VERSION, PAYLOAD_VERSION - 1})
# Messages published before the payload carried `v` had the previous version's shape.
UNVERSIONED = PAYLOAD_VERSION - 1


def payload_version_problem(payload: Any) -> str | None:
    """Why this worker must not run a message of this payload, by its version; None
    when it reads it (a payload that is no object has no version to refuse: the job
    id check decides it)."""
    if not isinstance(payload, dict):
        return None
    version = payload.get("v", UNVERSIONED)
    if isinstance(version, int) and not isinstance(version, bool) and version in READABLE_VERSIONS:
        return None
    shown = repr(version)[:40]
    readable = " and ".join(str(v) for v in sorted(READABLE_VERSIONS))
    return f"payload version {shown}: this worker reads versions {readable}"
