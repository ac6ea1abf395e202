"""jobops-client: the jobops API from Python (jobops' docs/client.md)."""

from jobops_client import webhooks
from jobops_client.client import Client, RetryInfo, __version__
from jobops_client.errors import (
    ApiError,
    ArtefactIntegrityError,
    JobOpsError,
    TransportError,
    WaitTimeout,
    WebhookVerificationError,
)
from jobops_client.models import Artefact, BatchResult, Job
from jobops_client.sse import Event, SSEDecoder

__all__ = [
    "ApiError",
    "Artefact",
    "ArtefactIntegrityError",
    "BatchResult",
    "Client",
    "Event",
    "Job",
    "JobOpsError",
    "RetryInfo",
    "SSEDecoder",
    "TransportError",
    "WaitTimeout",
    "WebhookVerificationError",
    "__version__",
    "webhooks",
]
