"""The API docs pages work offline: every asset they load comes from this server."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("url", ["/api/v1/docs/", "/api/v1/redoc/"])
def test_the_docs_pages_load_only_local_assets(client, url):
    page = client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+\.(?:js|css|png))"', html)
    assert assets, html[:500]
    assert not re.search(r'(?:src|href)="(?:https?:)?//', html), "an asset from another host"
    for asset in assets:
        served = client.get(asset)
        assert served.status_code == 200, asset
        b"".join(served.streaming_content) if served.streaming else served.content
    assert "/api/v1/schema/" in html
