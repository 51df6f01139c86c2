"""The dashboard's static files as a real broker serves them: every file the page
loads, with its type and without signing in; a browser's revalidation; and 404
for anything else under /dashboard/, a path that leaves the folder included.
(The page itself in a browser: test_dashboard.py.)"""

from __future__ import annotations

import http.client
import json
import re

import pytest

from ..support.broker import managed_broker

pytestmark = pytest.mark.run_once  # its brokers choose their gateway processes


@pytest.fixture(scope="module")
def warren(tmp_path_factory):
    yield from managed_broker(tmp_path_factory, "dashboard-files")


def fetch(warren, path: str, headers: dict | None = None) -> http.client.HTTPResponse:
    """The response to GET `path`, sent exactly as written (no client-side
    normalising of `..`); its body read."""
    host, port = warren.http_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", path, headers=headers or {})
    response = conn.getresponse()
    response.body = response.read()
    conn.close()
    return response


def test_the_page_and_every_file_it_loads_are_served_with_their_types(warren):
    page = fetch(warren, "/")
    assert page.status == 200
    assert page.getheader("Content-Type") == "text/html; charset=utf-8"
    html = page.body.decode()
    assert fetch(warren, "/index.html").body == page.body  # as RabbitMQ's
    # the page's stylesheet and module, then each module's imports, transitively
    wanted = re.findall(r'(?:href|src)="(dashboard/[\w.-]+)"', html)
    assert "dashboard/dashboard.css" in wanted and "dashboard/main.js" in wanted
    seen = set()
    while wanted:
        path = wanted.pop()
        if path in seen:
            continue
        seen.add(path)
        response = fetch(warren, "/" + path)  # no credentials: the page loads before sign-in
        assert response.status == 200, path
        kind = "text/css" if path.endswith(".css") else "text/javascript"
        assert response.getheader("Content-Type") == f"{kind}; charset=utf-8", path
        assert response.getheader("X-Content-Type-Options") == "nosniff", path
        if path.endswith(".js"):
            imports = re.findall(r'^import [^;]*? from "\./([\w.-]+)";', response.body.decode(),
                                 re.M | re.S)
            wanted += ["dashboard/" + name for name in imports]
    assert len(seen) > 5, seen  # the modules were found, not only main.js


def test_a_browser_revalidates_a_file_by_its_etag(warren):
    first = fetch(warren, "/dashboard/main.js")
    etag = first.getheader("ETag")
    assert etag and first.getheader("Cache-Control") == "no-cache"
    again = fetch(warren, "/dashboard/main.js", {"If-None-Match": etag})
    assert (again.status, again.body) == (304, b"")
    other = fetch(warren, "/dashboard/main.js", {"If-None-Match": '"something-else"'})
    assert (other.status, other.body) == (200, first.body)


@pytest.mark.parametrize("path", [
    "/dashboard/../api.py", "/dashboard/..%2fapi.py", "/dashboard/%2e%2e%2fstatic.py",
    "/dashboard/../../pyproject.toml", "/dashboard/%2e%2e/http.py", "/dashboard/nothing.js",
    "/dashboard/", "/dashboard", "/dashboard/index.html", "/dashboard/main.js/x",
    "/main.js", "/dashboard.css"])
def test_anything_else_is_not_found(warren, path):
    response = fetch(warren, path)
    assert response.status == 404, path
    assert json.loads(response.body) == {"error": "Object Not Found", "reason": "Not Found"}
