"""The state machine under its documented path (`jobs.states.ALLOWED`, ...; docs and
tools/upgrade_writes.py, which also runs in older releases' trees): it lives in
`jobs.domain.states`; this module re-exports it. Code in this repository imports
`jobs.domain.states`.
"""

from jobs.domain.states import (
    ALLOWED,
    DUE_EVENT,
    EVENT_FOR_STATUS,
    STATUS_AFTER_EVENT,
    TERMINAL,
    Status,
)

__all__ = ["ALLOWED", "DUE_EVENT", "EVENT_FOR_STATUS", "STATUS_AFTER_EVENT", "TERMINAL", "Status"]
