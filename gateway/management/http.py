"""A small HTTP/1.1 server on asyncio streams for the management API: requests
with JSON bodies, keep-alive, Basic authentication. No framework: the API is a
handful of routes and runs on the gateway's own event loop."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
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

    def json(self, types: dict | None = None) -> dict:
        """The body: a JSON object ({} when empty) whose fields named in `types`,
        where present, are of those JSON types; 400 otherwise."""
        if not self.body:
            return {}
        try:
            value = json.loads(self.body)
        except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
            raise bad_request("body is not valid JSON") from None
        if not isinstance(value, dict):
            raise bad_request("body must be a JSON object")
        check_types(value, types or {})
        return value

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


def bad_request(reason: str) -> HTTPError:
    return HTTPError(400, "bad_request", reason)


JSON_TYPES = {str: "a string", int: "an integer", bool: "a boolean", dict: "an object",
              list: "an array"}


def check_types(value: dict, types: dict, where: str = "") -> None:
    """400 unless each field named in `types` (name -> type or tuple of types) is
    absent or of that JSON type."""
    for name, kinds in types.items():
        if name not in value:
            continue
        kinds = kinds if isinstance(kinds, tuple) else (kinds,)
        field = value[name]
        # JSON true and false are not integers
        if not isinstance(field, kinds) or (isinstance(field, bool) and bool not in kinds):
            raise bad_request(f"{where}{name} must be "
                              f"{' or '.join(JSON_TYPES[kind] for kind in kinds)}")


Handler = Callable[[Request], Awaitable[Response]]


async def start_server(handler: Handler, host: str, port: int) -> asyncio.AbstractServer:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        peer_host = peer[0] if isinstance(peer, tuple) else ""
        try:
            while True:
                try:
                    request = await _read_request(reader, peer_host)
                except HTTPError as error:
                    # malformed: answer, then hang up, as where the next request
                    # would start is unknown
                    writer.write(_encode(error.response(), keep_alive=False))
                    await writer.drain()
                    break
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
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        except asyncio.CancelledError:
            pass  # the broker stops; raised on, Python 3.11's streams log it as a crash
        finally:
            writer.close()

    return await asyncio.start_server(serve, host, port, reuse_address=True,
                                      start_serving=False)


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


async def _read_request(reader: asyncio.StreamReader, peer: str) -> Request | None:
    """The next request, or None when the client closed between requests;
    HTTPError 400 when it is malformed."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as error:
        if error.partial.strip():
            raise bad_request("incomplete request head") from None
        return None
    except asyncio.LimitOverrunError:
        raise bad_request("request head too large") from None
    lines = head[:-4].decode("latin-1").split("\r\n")
    request_line = lines[0].split(" ")
    if (len(request_line) != 3 or not _TOKEN.fullmatch(request_line[0])
            or request_line[2] not in ("HTTP/1.0", "HTTP/1.1")):
        raise bad_request("malformed request line")
    method, target, _version = request_line
    headers = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(name):
            raise bad_request("malformed header line")
        name, value = name.lower(), value.strip()
        if name == "content-length" and headers.get(name, value) != value:
            raise bad_request("conflicting Content-Length headers")
        headers[name] = value
    if "transfer-encoding" in headers:
        raise bad_request("Transfer-Encoding is not supported; send a Content-Length")
    length = headers.get("content-length", "0")
    if not (length.isascii() and length.isdigit()):
        raise bad_request("bad Content-Length")
    if int(length) > MAX_BODY:
        raise bad_request(f"body larger than {MAX_BODY} bytes")
    body = await reader.readexactly(int(length))
    try:
        return Request(method.upper(), target, headers, body, peer)
    except ValueError:  # urlsplit's, e.g. for "http://[::1"
        raise bad_request("malformed request target") from None


def _encode(response: Response, keep_alive: bool) -> bytes:
    head = [f"HTTP/1.1 {response.status} {HTTPStatus(response.status).phrase}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}",
            "Cache-Control: no-cache",
            "Connection: keep-alive" if keep_alive else "Connection: close"]
    head += [f"{name}: {value}" for name, value in response.headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + response.body
