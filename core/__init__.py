"""Project-level plumbing shared by the apps (jobs, audit, dlq); depends on none of them."""
