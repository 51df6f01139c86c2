"""A small HTTP/1.1 server on asyncio streams for the management API: requests
with JSON bodies, keep-alive, Basic authentication. No framework: the API is a
handful of routes and runs on the gateway's own event loop."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from http import HTTPStatus
from typing import Awaitable, Callable
from urllib.parse import parse_qs, unquote, urlsplit

log = logging.getLogger("warren.management")

MAX_BODY = 64 << 20


class Request:
    __slots__ = ("method", "path", "parts", "query", "headers", "body", "peer", "user")

    def __init__(self, method: str, target: str, headers: dict, body: bytes, peer: str):
        url = urlsplit(target)
        self.method = method
        self.path = url.path
        # path segments, percent-decoded one by one (so %2F stays inside a segment)
        self.parts = [unquote(p) for p in url.path.strip("/").split("/") if p != ""]
        self.query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.headers = headers
        self.body = body
        self.peer = peer
        self.user = None

    def json(self):
        if not self.body:
            return {}
        try:
            return json.loads(self.body)
        except ValueError:
            raise HTTPError(400, "bad_request", "body is not valid JSON") from None

    def credentials(self) -> tuple[str, str] | None:
        header = self.headers.get("authorization", "")
        if not header.lower().startswith("basic "):
            return None
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        return user, password


class Response:
    __slots__ = ("status", "body", "content_type", "headers")

    def __init__(self, status: int = 200, body: bytes = b"",
                 content_type: str = "application/json", headers: dict | None = None):
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers or {}

    @classmethod
    def json(cls, value, status: int = 200) -> "Response":
        return cls(status, json.dumps(value, default=str).encode())


class HTTPError(Exception):
    def __init__(self, status: int, error: str, reason: str, headers: dict | None = None):
        super().__init__(reason)
        self.status = status
        self.error = error
        self.reason = reason
        self.headers = headers or {}

    def response(self) -> Response:
        return Response(self.status, json.dumps({"error": self.error,
                                                 "reason": self.reason}).encode(),
                        headers=self.headers)


Handler = Callable[[Request], Awaitable[Response]]


async def start_server(handler: Handler, host: str, port: int) -> asyncio.AbstractServer:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        peer_host = peer[0] if isinstance(peer, tuple) else ""
        try:
            while True:
                request = await _read_request(reader, peer_host)
                if request is None:
                    break
                try:
                    response = await handler(request)
                except HTTPError as error:
                    response = error.response()
                except Exception:  # a bug must not take the listener down
                    log.exception("management request %s %s failed", request.method,
                                  request.path)
                    response = HTTPError(500, "internal_error", "see the broker log").response()
                keep_alive = request.headers.get("connection", "").lower() != "close"
                writer.write(_encode(response, keep_alive))
                await writer.drain()
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, _BadRequest):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(serve, host, port, reuse_address=True,
                                      start_serving=False)


class _BadRequest(Exception):
    pass


async def _read_request(reader: asyncio.StreamReader, peer: str) -> Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as error:
        if error.partial.strip():
            raise _BadRequest() from None
        return None
    except asyncio.LimitOverrunError:
        raise _BadRequest() from None
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, _version = lines[0].split(" ", 2)
    except ValueError:
        raise _BadRequest() from None
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    if length > MAX_BODY:
        raise _BadRequest()
    body = await reader.readexactly(length) if length else b""
    return Request(method.upper(), target, headers, body, peer)


def _encode(response: Response, keep_alive: bool) -> bytes:
    head = [f"HTTP/1.1 {response.status} {HTTPStatus(response.status).phrase}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}",
            "Cache-Control: no-cache",
            "Connection: keep-alive" if keep_alive else "Connection: close"]
    head += [f"{name}: {value}" for name, value in response.headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + response.body
