"""/api/v1/ routes. Each path answers with and without its trailing slash."""

from __future__ import annotations

from django.urls import path
from drf_spectacular.views import SpectacularRedocView, SpectacularSwaggerView

from core.api.routing import with_slash_alias
from core.api.schema import SchemaApi
from jobs.api import audit_proofs, batch, state, uploads, views, webhooks

app_name = "api"


urlpatterns = [
    *with_slash_alias("jobs", views.JobCollectionApi.as_view(), "jobs"),
    *with_slash_alias("jobs/batch", batch.JobBatchCreateApi.as_view(), "jobs-batch"),
    *with_slash_alias("jobs/<uuid:job_id>", views.JobDetailApi.as_view(), "job-detail"),
    *with_slash_alias("jobs/<uuid:job_id>/cancel", views.JobCancelApi.as_view(), "job-cancel"),
    *with_slash_alias("jobs/<uuid:job_id>/retry", views.JobRetryApi.as_view(), "job-retry"),
    *with_slash_alias(
        "jobs/<uuid:job_id>/audit-proof", audit_proofs.JobAuditProofApi.as_view(), "job-audit-proof"
    ),
    *with_slash_alias(
        "audit/tree-heads/consistency",
        audit_proofs.TreeHeadConsistencyApi.as_view(),
        "audit-tree-heads-consistency",
    ),
    *with_slash_alias(
        "jobs/<uuid:job_id>/artefacts/<uuid:artefact_id>",
        views.JobArtefactApi.as_view(),
        "job-artefact",
    ),
    *with_slash_alias("uploads", uploads.UploadCreateApi.as_view(), "uploads"),
    *with_slash_alias(
        "uploads/<uuid:upload_id>", uploads.UploadDetailApi.as_view(), "upload-detail"
    ),
    *with_slash_alias("queues", state.QueueListApi.as_view(), "queues"),
    # The async spec's name for the same answer (docs/operator-controls.md#queue-state);
    # documented once, under /queues.
    *with_slash_alias("jobs/queues/depth", state.QueueDepthAliasApi.as_view(), "queues-depth"),
    *with_slash_alias("connectors", state.ConnectorListApi.as_view(), "connectors"),
    *with_slash_alias("webhooks", webhooks.WebhookCollectionApi.as_view(), "webhooks"),
    *with_slash_alias(
        "webhooks/<int:webhook_id>", webhooks.WebhookDetailApi.as_view(), "webhook-detail"
    ),
    *with_slash_alias(
        "webhooks/<int:webhook_id>/rotate", webhooks.WebhookRotateApi.as_view(), "webhook-rotate"
    ),
    path("schema/", SchemaApi.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api:schema"), name="docs"),
    path("redoc/", SpectacularRedocView.as_view(url_name="api:schema"), name="redoc"),
]
