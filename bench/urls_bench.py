"""URLs for bench/settings_bench.py: the app's own routes plus POST /bench/bare and
POST /bench/service."""

from __future__ import annotations

import json

from django.db import connection
from django.urls import path
from rest_framework import status
from rest_framework.authentication import TokenAuthentication
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from config.urls import handler404, handler500  # noqa: F401
from config.urls import urlpatterns as app_urlpatterns
from jobs.services import job_create

BENCH_TABLE_SQL = (
    "CREATE TABLE IF NOT EXISTS bench_rows (id bigserial PRIMARY KEY, owner_id integer NOT NULL, "
    "payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
)


class BareInsertApi(APIView):
    """Token-authenticated JSON POST that inserts one row: the floor for job creation."""

    parser_classes = [JSONParser]
    # DRF's own token authentication, whatever the app configures: the floor stays the
    # stock "token-auth DRF insert" the targets are set against (the app's is prepared).
    authentication_classes = [TokenAuthentication]

    def post(self, request: Request) -> Response:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO bench_rows (owner_id, payload) VALUES (%s, %s) RETURNING id",
                [request.user.pk, json.dumps(request.data)],
            )
            (row_id,) = cursor.fetchone()
        return Response({"id": row_id}, status=status.HTTP_201_CREATED)


class ServiceCreateApi(APIView):
    """Token-authenticated JSON POST that creates a job through the service alone
    (`job_create`: the type's params schema, the caller's organisation, the row with its
    `created` entry, event and NOTIFY), without the API's layer (its own token
    authentication, the create throttle, the body's serializer, the answer's): the floor
    of a create that keeps every promise of a job, measured beside the bare insert."""

    parser_classes = [JSONParser]
    authentication_classes = [TokenAuthentication]

    def post(self, request: Request) -> Response:
        body = request.data
        job, _created = job_create(
            owner=request.user,
            job_type=body["type"],
            params=body["params"],
            idempotency_key=body.get("idempotency_key"),
        )
        return Response({"id": str(job.id)}, status=status.HTTP_201_CREATED)


urlpatterns = [
    path("bench/bare", BareInsertApi.as_view()),
    path("bench/service", ServiceCreateApi.as_view()),
    *app_urlpatterns,
]
