class AuditImmutableError(Exception):
    """Raised on any attempt to change or remove an audit row from the application."""
