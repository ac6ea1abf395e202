"""/api/v1/admin/ routes of the DLQ API. Each path answers with and without its slash."""

from __future__ import annotations

from core.api.routing import with_slash_alias
from dlq.api import connectors, queues, views

app_name = "dlq-api"

urlpatterns = [
    *with_slash_alias("dlq", views.DlqListApi.as_view(), "list"),
    *with_slash_alias("jobs/cancel", views.JobsCancelApi.as_view(), "jobs-cancel"),
    *with_slash_alias(
        "dlq/operations/<str:operation_id>", views.DlqOperationApi.as_view(), "operation"
    ),
    *with_slash_alias(
        "dlq/operations/<str:operation_id>/stop",
        views.DlqOperationStopApi.as_view(),
        "operation-stop",
    ),
    *with_slash_alias("dlq/<str:queue>/peek", views.DlqPeekApi.as_view(), "peek"),
    *with_slash_alias("dlq/<str:queue>/replay", views.DlqReplayApi.as_view(), "replay"),
    *with_slash_alias("dlq/<str:queue>/discard", views.DlqDiscardApi.as_view(), "discard"),
    *with_slash_alias("queues/<str:queue>/pause", queues.QueuePauseApi.as_view(), "queue-pause"),
    *with_slash_alias("queues/<str:queue>/resume", queues.QueueResumeApi.as_view(), "queue-resume"),
    *with_slash_alias(
        "connectors/<str:name>/open", connectors.ConnectorOpenApi.as_view(), "connector-open"
    ),
    *with_slash_alias(
        "connectors/<str:name>/close", connectors.ConnectorCloseApi.as_view(), "connector-close"
    ),
]
