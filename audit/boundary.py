"""Where the live database's history begins once partitions were detached
(docs/operations/audit-archives.md#verifying-the-whole-history).

The ops chain's `audit_partition_detached` entries (audit.detach) say which partitions
left: a chain whose older segments went starts after the last detached segment's entry
(the ops chain), a head a checkpoint names may be gone with its partition, and every
partition from the oldest known month to the current one must be attached or detached
by audit_detach (one dropped directly shows as `partition_missing`). Live verification
(audit.verification) reads it; audit.history adds what the archives hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime

from django.db import connection
from django.utils import timezone

from audit.detach import Detached, detached_partitions
from audit.partition_archive import PQ
from audit.partitions import LEGACY_PARTITION, list_partitions
from audit.report import MAX_PROBLEMS, Problem, VerificationReport, job_of


@dataclass
class Boundary:
    """Where the live database's history begins (see the module's docstring)."""

    detached: list[Detached] = field(default_factory=list)
    starts: dict[str, tuple[int, str]] = field(default_factory=dict)
    archived_upto: int = 0  # the newest checkpoint a detached partition's archive carries
    archived_heads: dict[str, int] | None = None  # chain → head seq, from verified archives

    def check_heads(
        self,
        report: VerificationReport,
        genuine: list[int],
        selected: list[str] | None,
        since: datetime | None,
    ) -> None:
        if not genuine:
            return
        archived = self.archived_heads or {}
        params = {
            "genuine": genuine,
            "chains": selected,
            "since": since,
            "limit": MAX_PROBLEMS,
            "s_chains": list(self.starts),
            "s_seqs": [s[0] for s in self.starts.values()],
            "archived": self.archived_heads is not None,
            "a_chains": list(archived),
            "a_heads": list(archived.values()),
            "archived_upto": self.archived_upto,
        }
        with connection.cursor() as cursor:
            cursor.execute(PQ["verify_heads_detached"], params)
            rows = cursor.fetchall()
        report.heads_checked += rows[0][0]
        report.heads_deferred += rows[0][1]
        for _n, _d, cp_id, chain, seq, head_hash, found in rows:
            if cp_id is None:
                continue
            where = "neither in the database nor in a verified archive"
            report.add(
                Problem(
                    kind="head_missing" if found is None else "head_changed",
                    message=(
                        f"head seq {seq} recorded by the checkpoint is {where}"
                        if found is None
                        else f"head seq {seq} has chain_hash {found}, the checkpoint "
                        f"recorded {head_hash}"
                    ),
                    chain=chain,
                    job_id=job_of(chain),
                    seq=seq,
                    checkpoint_id=cp_id,
                )
            )

    def check_partitions(self, report: VerificationReport) -> None:
        """Every partition from the oldest month known to the current one is attached or
        was detached by audit_detach; the legacy partition too."""
        gone = {d.partition for d in self.detached}
        present = list_partitions()
        names = {p.name for p in present}
        if LEGACY_PARTITION not in names and LEGACY_PARTITION not in gone:
            report.add(_missing(LEGACY_PARTITION))
        months = [p.month for p in present if p.month is not None]
        months += [
            date.fromisoformat(d.part).replace(day=1) for d in self.detached if d.kind != "legacy"
        ]
        if not months:
            return
        today = timezone.now().date()
        year, month = min(months).year, min(months).month
        while (year, month) <= (today.year, today.month):
            for kind in ("job", "ops"):
                name = f"audit_logs_{kind}_{year:04d}_{month:02d}"
                if name not in names and name not in gone:
                    report.add(_missing(name))
            year, month = (year + 1, 1) if month == 12 else (year, month + 1)

    def checkpoint_ids(self) -> None:
        """archived_upto from the checkpoints the detached partitions name."""
        for detached in self.detached:
            with connection.cursor() as cursor:
                cursor.execute(PQ["checkpoint_by_hash"], {"hash": detached.checkpoint_hash})
                row = cursor.fetchone()
            if row is not None:
                self.archived_upto = max(self.archived_upto, int(row[0]))


def _missing(name: str) -> Problem:
    return Problem(
        kind="partition_missing",
        message=f"partition {name} is neither in the database nor detached by audit_detach "
        "(no `audit_partition_detached` entry names it): its rows are gone without an archive",
    )


def live_boundary(extra: list[Detached] | None = None) -> Boundary:
    """The boundary of the live database, from the ops chain's detach entries (and
    `extra`: those read from archives of ops partitions detached since)."""
    live = detached_partitions()
    seen: dict[str, Detached] = {d.partition: d for d in (extra or [])}
    for detached in live:
        seen[detached.partition] = detached
    boundary = Boundary(detached=list(seen.values()))
    for detached in live:  # in the order they went: the last one wins
        for chain, seq, digest in detached.segments:
            boundary.starts[chain] = (seq + 1, digest)
    boundary.checkpoint_ids()
    return boundary
