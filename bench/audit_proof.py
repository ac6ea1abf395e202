"""Benchmark: a job's audit proof, its size and its offline verification (docs/benchmarks.md).

Scratch database `jobops_bench_audit_proof`:

1. --heads - 1 job chains of ten entries (bench/_chains.py, COPY), and one real job of
   ten entries through the services: created, queued, started, six progress,
   succeeded. One checkpoint names all the heads (5,000 = MAX_HEADS: the largest heads
   tree a checkpoint has): leaf 0 of the checkpoint log.
2. A year of checkpoints after it at one a minute (--log, 525,600 leaves in all), loaded
   by COPY into audit_tree_heads: each row the nodes its leaf completes, computed as
   audit.tree does, over random checkpoint hashes; then one more real checkpoint, whose
   tree head (signed) is the newest. The job's checkpoint being the first leaf, its
   audit path in the log is the longest (20 hashes).
3. The job's proof (audit.proofs.job_proof, as the API builds it): its bytes as the API
   sends them (compact JSON), the time to build it, and the time to verify it with the
   public key alone (audit.proofs.verify_job_proof, parsing included; median of --runs),
   and `manage.py verify_audit_chain --proof` as a process (its wall time is mostly
   Django's start).
Targets (issue 42): a proof <= 8 KB, verified in <= 100 ms. Writes
bench/results/audit_proof.json.

Usage: python bench/audit_proof.py [--log 525600] [--heads 5000] [--runs 50] [--quick] [--keep]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as common
from bench._chains import copy_chains

NAME = "audit_proof"
FULL = {"log": 525_600, "heads": 5_000, "runs": 50}
QUICK = {"log": 10_000, "heads": 500, "runs": 10}


def load_log(scratch: common.Scratch, leaves: int) -> None:
    """COPY `leaves` tree heads (audit.tree's layout) over random checkpoint hashes, after
    the log's current ones."""
    from audit.merkle import leaf_hash
    from audit.tree import fold, subtrees
    from audit.tree_log import latest_tree_head, stored_tree

    latest = latest_tree_head()
    start = latest.tree_size if latest else 0
    tree = stored_tree()
    tree._fetch(set(subtrees(0, start)))
    frontier = [tree.nodes[k] for k in subtrees(0, start)]
    with scratch.connect(autocommit=False) as conn, conn.cursor() as cursor:
        columns = "tree_size, checkpoint_id, checkpoint_hash, root_hash, created_at, key_id, "
        columns += "signature, nodes"
        with cursor.copy(f"COPY audit_tree_heads ({columns}) FROM STDIN") as copy:
            for index in range(start, start + leaves):
                digest = os.urandom(32)
                created = [leaf_hash(digest)]
                i = index
                while i & 1:
                    created.append(_node(frontier.pop(), created[-1]))
                    i >>= 1
                frontier.append(created[-1])
                nodes = "{" + ",".join(h.hex() for h in created) + "}"
                root = fold(frontier).hex()
                copy.write_row(
                    (index + 1, -(index + 1), digest.hex(), root, "2026-01-01T00:00:00Z",
                     "bench", "", nodes)
                )  # fmt: skip
        conn.commit()


def _node(left: bytes, right: bytes) -> bytes:
    from audit.merkle import node_hash

    return node_hash(left, right)


def load_chains(scratch: common.Scratch, chains: int) -> None:
    with scratch.connect(autocommit=False) as conn:
        conn.execute("ALTER TABLE audit_logs DISABLE TRIGGER USER")
        copy_chains(conn, [str(uuid.uuid4()) for _ in range(chains)], per_job=10, by_chain=True)
        conn.execute("ALTER TABLE audit_logs ENABLE TRIGGER USER")
        conn.commit()
    with scratch.connect() as conn:
        conn.execute("VACUUM ANALYZE audit_logs")


def real_job() -> Any:
    """A sim job through the services: created, queued, started, six progress, succeeded."""
    from audit.services import Actor
    from jobs.services import job_succeed
    from jobs.services.transitions import Progress, job_progress_audit
    from tests.factories import fence_of, job_in_state

    job = job_in_state("running")
    fence = fence_of(job)
    for step in range(1, 7):
        job_progress_audit(
            job_id=job.id,
            fence=fence,
            progress=Progress(step * 14, f"step {step}", f"step {step} of 7"),
            actor=Actor.system(fence.locked_by),
        )
    return job_succeed(job_id=job.id, fence=fence, result={"steps": 7})


def main() -> int:
    parser = common.parser_for(__doc__)
    parser.add_argument("--log", type=int, help="checkpoints already in the log [525600]")
    parser.add_argument("--heads", type=int, help="heads in the job's checkpoint [5000]")
    parser.add_argument("--runs", type=int, help="verifications timed [50]")
    args = common.resolve_sizes(parser.parse_args(), full=FULL, quick=QUICK)
    report = common.Report(NAME, args)
    with common.Scratch(NAME, keep=args.keep) as scratch:
        scratch.setup_django()
        from audit.checkpoints import checkpoint_write
        from audit.proofs import job_proof, verify_job_proof
        from audit.signing import public_key_text

        load_chains(scratch, args.heads - 1)
        job = real_job()
        with common.stopwatch() as timing:
            checkpoint = checkpoint_write()
        assert checkpoint is not None and len(checkpoint.heads) == args.heads
        report.figure("checkpoint_seconds", round(timing["seconds"], 3), "s")
        # The job's checkpoint is leaf 0 of a year's log: the longest audit path.
        with common.stopwatch() as timing:
            load_log(scratch, args.log - 1)
        report.figure("log_load_seconds", round(timing["seconds"], 1), "s")
        real_job()
        newest = checkpoint_write()  # the newest tree head: a real, signed one
        assert newest is not None
        with common.stopwatch() as timing:
            proof = job_proof(job.id)
        report.figure("proof_build_ms", round(timing["seconds"] * 1000, 1), "ms")
        body = json.dumps(proof, separators=(",", ":")).encode()
        report.figure("entries", len(proof["entries"]), "entries")
        report.figure("log_tree_size", proof["log"]["tree_size"], "leaves")
        report.figure("heads_tree_size", proof["checkpoint"]["tree_size"], "leaves")
        key = public_key_text()
        times = []
        for _ in range(args.runs):
            started = time.perf_counter()
            result = verify_job_proof(json.loads(body), public_key=key)
            times.append(time.perf_counter() - started)
            assert result.ok, result.problems
        report.target(
            "proof_bytes",
            label="proof size (compact JSON)",
            value=len(body),
            unit="bytes",
            target=8 * 1024,
            higher_is_better=False,
        )
        report.target(
            "verify_ms",
            label="verify (median, in process)",
            value=round(statistics.median(times) * 1000, 2),
            unit="ms",
            target=100,
            higher_is_better=False,
        )
        path = common.RESULTS_DIR / "audit_proof.sample.json"
        path.write_bytes(body)
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "manage.py", "verify_audit_chain", "--proof", str(path),
             "--public-key", key],
            cwd=common.ROOT, env=scratch.env(), capture_output=True, text=True,
        )  # fmt: skip
        report.figure(
            "verify_process_seconds", round(time.perf_counter() - started, 2), "s",
            label=f"verify_audit_chain --proof as a process (exit {done.returncode})",
        )  # fmt: skip
        report.write(scratch)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
