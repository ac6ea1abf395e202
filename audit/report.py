"""What a verification found (audit.verification, and the checks beside it: archives,
incremental runs, proofs, keyrings, the live boundary): the problems, each naming the
chain, job, seq or checkpoint at fault, and the counts of what was checked."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# A wholesale tamper could yield a problem per row; keep the first ones only.
MAX_PROBLEMS = 1_000


@dataclass(frozen=True)
class Problem:
    kind: str
    message: str
    chain: str | None = None
    job_id: str | None = None
    seq: int | None = None
    checkpoint_id: int | None = None

    def __str__(self) -> str:
        where = []
        if self.chain is not None:
            where.append(f"chain {self.chain}")
        if self.job_id is not None:
            where.append(f"job {self.job_id}")
        if self.seq is not None:
            where.append(f"seq {self.seq}")
        if self.checkpoint_id is not None:
            where.append(f"checkpoint {self.checkpoint_id}")
        return f"{', '.join(where) or 'audit'}: {self.kind}: {self.message}"


@dataclass
class VerificationReport:
    rows_checked: int = 0
    chains_checked: int = 0
    checkpoints_checked: int = 0
    heads_checked: int = 0
    tree_heads_checked: int = 0
    # Heads of checkpoints whose partition was detached, not checked without its archive
    # (audit.history: verify_audit_chain --archives checks them).
    heads_deferred: int = 0
    streams: int = 0  # chain ranges read side by side
    problems: list[Problem] = field(default_factory=list)
    problems_total: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.problems_total == 0

    def add(self, problem: Problem) -> None:
        self.problems_total += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(problem)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = self.ok
        data["problems_truncated"] = self.problems_total - len(self.problems)
        return data


def job_of(chain: str) -> str | None:
    return chain[4:] if chain.startswith("job:") else None
