"""What the services reach outside PostgreSQL (docs/architecture.md#layers): the
broker's topology and the publisher (transport only: it knows no service), the
payload version of a message (`wire.py`), queue depths and back-pressure, rate limits
and their Redis client, the processes' liveness beats, and the metrics every layer
counts in. Below the selectors and the services, which call it; it reads the models and
the named SQL, never a service.
"""
