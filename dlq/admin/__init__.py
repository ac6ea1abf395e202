"""Dead-letter pages of the operator portal (docs/operations/portal.md#pages).

- the DLQ overview: each DLQ's broker depth and open dead letters (refreshes itself);
- the dead-letter list, from the database: filters, and the rows grouped by cause;
- peek: a DLQ's broker messages, decoded, nothing consumed;
- replay / discard of one, selected or all matching a filter: a dry-run count and a
  sample first, a required justification, then the work (in the background when large);
- background operations: progress that refreshes itself, and Stop.

Rows and operations are read-only here; every change goes through `dlq.services` and
`dlq.bulk`, which check the operator's permission again (403 if a page is bypassed).
"""

from __future__ import annotations

# Django's admin autodiscovery imports this package: importing the pages registers them.
from dlq.admin.dead_letters import DeadLetterAdmin as DeadLetterAdmin
from dlq.admin.operations import BulkOperationAdmin as BulkOperationAdmin
