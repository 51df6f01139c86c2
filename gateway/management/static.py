"""The dashboard's files, shipped as package data in dashboard/: its page at `/`
(and `/index.html`, as RabbitMQ's), its stylesheet and ES modules at
`/dashboard/{name}`. Only a file of that folder with a known type is served, so
a path leaving it (`/dashboard/../api.py`, `%2e%2e%2f`) is not. No max-age:
the paths are not versioned, so a browser revalidates each file by its ETag
and an upgraded broker's page never runs a stale module."""

from __future__ import annotations

import hashlib
from importlib import resources

from .http import Request, Response

CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
                 ".js": "text/javascript; charset=utf-8"}


def serve(request: Request) -> Response | None:
    """The page or file the request's path names; None when it names none of them."""
    parts = request.parts
    if not parts or parts == ["index.html"]:
        return _serve(request, "index.html")
    # not the page under /dashboard/: its relative paths only hold at /
    if len(parts) == 2 and parts[0] == "dashboard" and parts[1] != "index.html":
        return _serve(request, parts[1])
    return None


def _serve(request: Request, name: str) -> Response | None:
    folder = resources.files("warren.gateway.management").joinpath("dashboard")
    content_type = CONTENT_TYPES.get("." + name.rpartition(".")[2])
    if content_type is None or name not in {f.name for f in folder.iterdir()}:
        return None
    body = folder.joinpath(name).read_bytes()
    etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    headers = {"ETag": etag, "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
    if etag in [tag.strip() for tag in request.headers.get("if-none-match", "").split(",")]:
        return Response(304, b"", content_type, headers)
    return Response(200, body, content_type, headers)
