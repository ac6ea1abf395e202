"""The dead-letter record lives in `jobs.models` (a failed job and its dead letter are
written together); this app holds the operator tooling around it."""
