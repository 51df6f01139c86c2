"""The management listener on aiohttp: its low-level server, on the gateway's own
event loop, hands each request to the API's dispatcher as a Request (path split
into percent-decoded segments, JSON body helpers) and sends back its Response.
Malformed HTTP is answered as RabbitMQ's API answers bad input, 400 with
{"error": "bad_request", "reason": ...}, and logged on one line. A request must
arrive whole (head and body) within a deadline, and connections are capped in all
and per address (admission.py), so that slow clients cannot hold the descriptors
the AMQP listener needs."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import ssl
from typing import Awaitable, Callable
from urllib.parse import parse_qs, unquote, urlsplit

from aiohttp import web
from aiohttp.http_exceptions import InvalidURLError

from .admission import Admission

log = logging.getLogger("warren.management")

MAX_BODY = 64 << 20
# Seconds an idle connection is kept after its last answer: cowboy's idle_timeout,
# RabbitMQ's HTTP server.
KEEPALIVE = 60.0
REFUSALS_LOGGED_EVERY = 10.0  # seconds: a flood of refused connections is one line
# Bytes a second a body must arrive at, beyond the request timeout: a large
# definitions file over a slow link is read, a trickle is not.
MIN_BODY_RATE = 64 << 10
MAX_NAME = 255  # bytes: names are AMQP short strings
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1  # what an AMQP field and the stores hold


class Request:
    __slots__ = ("method", "path", "parts", "query", "headers", "body", "peer", "user")

    def __init__(self, method: str, target: str, headers, body: bytes, peer: str):
        url = urlsplit(target)
        self.method = method
        self.path = url.path
        # path segments, percent-decoded one by one (so %2F stays inside a segment)
        self.parts = [unquote(p) for p in url.path.strip("/").split("/") if p != ""]
        self.query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.headers = headers  # case-insensitive
        self.body = body
        self.peer = peer
        self.user = None

    def json(self, types: dict | None = None) -> dict:
        """The body: a JSON object ({} when empty) whose fields named in `types`,
        where present, are of those JSON types; 400 otherwise."""
        if not self.body:
            return {}
        try:
            text = self.body.decode()
            value = json.loads(text, parse_constant=_not_json)
        except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
            raise bad_request("body is not valid JSON") from None
        if not isinstance(value, dict):
            raise bad_request("body must be a JSON object")
        if _ESCAPE.search(text) or _LONG_NUMBER.search(text):
            _clean(value)
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
        body = json.dumps({"error": self.error, "reason": self.reason}).encode() \
            if self.error else b""  # RabbitMQ's 405 has no body
        return Response(self.status, body, headers=self.headers)


def bad_request(reason: str) -> HTTPError:
    return HTTPError(400, "bad_request", reason)


def not_found() -> HTTPError:
    return HTTPError(404, "Object Not Found", "Not Found")


def not_authorised(reason: str) -> HTTPError:
    return HTTPError(401, "not_authorised", reason)


def check_name(kind: str, name: str) -> None:
    """400, in RabbitMQ's words for a queue, for a name longer than AMQP can carry
    (or the stores' keys hold)."""
    size = len(name.encode())
    if size > MAX_NAME:
        raise bad_request(f"{kind} should be less than {MAX_NAME} bytes, actually was {size}\n")


def _not_json(constant: str):
    raise ValueError(f"{constant} is not JSON")


# A body without these has no surrogate escape (UTF-8 cannot carry a raw one) and no
# integer past 64 bits (19 digits): most bodies, a large definitions import among them.
_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_LONG_NUMBER = re.compile(r"[0-9]{19}")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean(root) -> None:
    """Replace lone surrogates (from \\udc00 escapes; UTF-8 cannot hold them) with
    U+FFFD in the decoded body's strings, keys too, as RabbitMQ stores them; 400
    for an integer beyond 64 bits. Without recursion: the body may nest deeply."""
    stack = [root]
    while stack:
        node = stack.pop()
        items = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
        for key, item in items:
            if isinstance(key, str) and _SURROGATE.search(key):
                del node[key]
                key = _SURROGATE.sub("\ufffd", key)
                node[key] = item
            if isinstance(item, str):
                if _SURROGATE.search(item):
                    node[key] = _SURROGATE.sub("\ufffd", item)
            elif isinstance(item, int) and not isinstance(item, bool):
                if not LONG_MIN <= item <= LONG_MAX:
                    raise bad_request(f"integers must be from {LONG_MIN} to {LONG_MAX}, "
                                      f"actually was one of {len(str(abs(item)))} digits")
            elif isinstance(item, (dict, list)):
                stack.append(item)


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


def flag(body: dict, name: str, default: bool) -> bool:
    """A boolean field: true or false, or "true" or "false" as rabbitmqadmin sends."""
    value = body.get(name, default)
    if value is True or value == "true":
        return True
    if value is False or value == "false":
        return False
    raise bad_request(f"{name} must be a boolean")


def arguments(body: dict) -> dict:
    """The arguments field: an object, or an empty array for none, as pyrabbit2
    sends and RabbitMQ takes."""
    value = body.get("arguments", {})
    if value == []:
        return {}
    if not isinstance(value, dict):
        raise bad_request("arguments must be an object")
    return value


Handler = Callable[[Request], Awaitable[Response]]


class Guard:
    """What every connection of one listener shares: the admission counts, the
    deadline for a request to arrive whole, when refusals were last logged."""

    def __init__(self, admission: Admission, request_timeout: float):
        self.admission = admission
        self.request_timeout = request_timeout
        self.logged_at = float("-inf")
        self.slow = 0  # connections cut since the last line about them

    def note(self, loop, what: str) -> None:
        """Log refusals and cuts, at most one line every REFUSALS_LOGGED_EVERY s."""
        now = loop.time()
        if now - self.logged_at < REFUSALS_LOGGED_EVERY:
            return
        self.logged_at = now
        log.warning("management listener: %s (since the last such line: %d connections "
                    "refused, %d cut for not sending a whole request within %.0f s)",
                    what, self.admission.refused, self.slow, self.request_timeout)
        self.admission.refused = self.slow = 0


class _Protocol(web.RequestHandler):
    """aiohttp's connection handler, answering what its parser refuses (a bad
    request line, header or Content-Length) with RabbitMQ's JSON 400 instead of
    aiohttp's plain text and logged traceback; refusing connections over the caps
    with a 503, and closing a connection whose request has not arrived whole
    within the deadline (aiohttp has no such timeout)."""

    def __init__(self, manager, guard: Guard, **kwargs):
        super().__init__(manager, keepalive_timeout=KEEPALIVE, **kwargs)
        self._guard = guard
        self._address: str | None = None  # once admitted
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if peer else ""
        refusal = self._guard.admission.admit(address)
        if refusal is not None:  # closed at once: its descriptor is free again
            body = json.dumps({"error": "service_unavailable", "reason": refusal}).encode()
            transport.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: "
                            b"application/json\r\nConnection: close\r\nContent-Length: "
                            + str(len(body)).encode() + b"\r\n\r\n" + body)
            transport.close()
            self._guard.note(self._loop, f"refused a connection: {refusal}")
            return
        self._address = address
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc) -> None:
        if self._address is None:
            return  # refused
        self._guard.admission.release(self._address)
        self._address = None
        self.request_read()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._address is None:
            return
        if self._deadline is None and data:  # the start of the next request
            self._arm()
        super().data_received(data)

    def _arm(self, extra: float = 0.0) -> None:
        self._deadline = self._loop.call_later(self._guard.request_timeout + extra,
                                               self._too_slow)

    def head_read(self, body_size: int) -> None:
        """The head arrived: the body has the time its size takes at MIN_BODY_RATE."""
        self.request_read()
        self._arm(body_size / MIN_BODY_RATE)

    def request_read(self) -> None:
        """The request arrived whole: its handling and answer take what they take."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        self._guard.slow += 1
        self._guard.note(self._loop, f"cut a connection from {self._address}: no whole "
                                     f"request within {self._guard.request_timeout:.0f} s")
        self.force_close()

    def handle_error(self, request, status=500, exc=None, message=None):
        if status >= 500 or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        # aiohttp's parser message, first line: "Bad status line", "Invalid method
        # encountered", "Got more than 65536 bytes when reading"...
        text = (message or (str(exc) if exc else "") or "bad request").strip()
        reason = text.splitlines()[0].rstrip(":")
        if isinstance(exc, InvalidURLError):  # its message is the target alone
            reason = f"malformed request target {reason}"
        log.info("malformed management request from %s: %s", request.remote, reason)
        response = web.json_response({"error": "bad_request", "reason": reason},
                                     status=status)
        response.force_close()
        return response


async def start_server(handler: Handler, host: str, port: int, guard: Guard,
                       tls: ssl.SSLContext | None = None) -> asyncio.AbstractServer:
    """The listener, bound, not yet serving (start_serving(), as asyncio's)."""

    async def serve(incoming: web.BaseRequest) -> web.StreamResponse:
        try:
            chunked = "chunked" in incoming.headers.get("Transfer-Encoding", "").lower()
            incoming.protocol.head_read(incoming.content_length or (MAX_BODY if chunked else 0))
            try:
                body = await _body(incoming)
            except (ConnectionError, RuntimeError):  # aiohttp's when the connection is gone
                if incoming.transport is not None and not incoming.transport.is_closing():
                    raise
                return web.Response(status=408)  # cut for being slow: nobody to answer
            incoming.protocol.request_read()
            request = Request(incoming.method, incoming.raw_path, incoming.headers, body,
                              incoming.remote or "")
            response = await handler(request)
        except HTTPError as error:
            response = error.response()
        except Exception:  # a bug must not take the listener down
            log.exception("management request %s %s failed", incoming.method, incoming.path)
            response = HTTPError(500, "internal_error", "see the broker log").response()
        return web.Response(status=response.status, body=response.body, headers={
            "Content-Type": response.content_type, "Cache-Control": "no-cache",
            **response.headers})

    loop = asyncio.get_running_loop()
    server = web.Server(serve)
    return await loop.create_server(
        lambda: _Protocol(server, guard, loop=loop, access_log=None, max_field_size=65536),
        host, port, ssl=tls, reuse_address=True, start_serving=False)


async def _body(request: web.BaseRequest) -> bytes:
    """The whole body (Content-Length or chunked), refused beyond MAX_BODY."""
    if (request.content_length or 0) > MAX_BODY:
        raise HTTPError(413, "bad_request", f"body larger than {MAX_BODY} bytes")
    parts, size = [], 0
    async for chunk in request.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > MAX_BODY:
            raise HTTPError(413, "bad_request", f"body larger than {MAX_BODY} bytes")
        parts.append(chunk)
    return b"".join(parts)
