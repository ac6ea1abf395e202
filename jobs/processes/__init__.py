"""What the long-running processes run around the services (docs/architecture.md#layers):
the dispatcher's loop and its step failures, the outbox relay (`events.py`) and the ERP
bridge. Above the services and the execution core, which never import it; the
interfaces (tasks, management commands) start it.
"""
