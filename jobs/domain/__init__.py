"""The job's rules as values (docs/architecture.md#layers): the state machine
(`states.py`), the models' value sets (`choices.py`), the job types and their policies
(`types.py`), each type's parameters (`params.py`), what a handler raises (`errors.py`,
published as `jobs.errors`) and what a service refuses (`exceptions.py`). No database
write, no broker: every other layer of `jobs` may import it, it imports none of them.
"""
