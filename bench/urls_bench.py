"""URLs for bench/settings_bench.py: the app's own routes plus POST /bench/bare."""

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


urlpatterns = [path("bench/bare", BareInsertApi.as_view()), *app_urlpatterns]
