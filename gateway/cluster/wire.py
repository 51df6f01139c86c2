"""The inter-node link's wire, sans-IO: frames, and the handshake that opens it.

A gateway process of node A reaches the shards of node B over one TCP
connection (remotelink.py), which B's relay (relay.py) serves. Every frame is a
fixed header (payload length u32, kind u8, shard u16, big-endian) and a
payload. Once the link is open, A sends COMMANDS (one encoded batch of shard
records for one shard, as a ring record carries them) and B sends EVENTS (the
same, the other way) and SHARD_DOWN / SHARD_UP (a shard of B died, or runs
again). A answers a SHARD_DOWN with one of its own: B then knows that A's
COMMANDS for that shard from there on were sent knowing it (relay.py). A may
send SEEN_ASK (an etcd revision, 8 bytes): B answers SEEN with the same once its
catalogue has applied that revision, so a change is answered only once every
node has it (cluster/node.py); and REPLY, a direct reply to a reply-to address
of B's (a peermessages.Reply).

The handshake proves to each side that the other knows the cluster's secret,
which never crosses the wire: B sends HELLO (a random nonce), A answers LOGIN
(its name, node number, gateway index, its own nonce and
HMAC-SHA256(secret, "warren-link-a" + both nonces + that identity)), and B
answers WELCOME (HMAC-SHA256(secret, "warren-link-b" + both nonces)). Each
side's nonce makes a recorded exchange useless for another connection. Until it
is done, frames are limited to HANDSHAKE_MAX bytes, so a peer that has not
proved anything cannot make a side buffer more. Any departure from this (a
wrong MAC, a frame out of turn, garbage, a frame too long) is a WireError, and
the connection is closed.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from typing import NamedTuple

from warren.shards.codec import encode_batch
from warren.shards.records import MAX_GATEWAYS, Deliver, GetReply, Publish

from ..config import MAX_MESSAGE_SIZE_LIMIT

HELLO, LOGIN, WELCOME, COMMANDS, EVENTS, SHARD_DOWN, SHARD_UP, SEEN_ASK, SEEN, REPLY = \
    range(1, 11)
KINDS = frozenset((HELLO, LOGIN, WELCOME, COMMANDS, EVENTS, SHARD_DOWN, SHARD_UP, SEEN_ASK,
                   SEEN, REPLY))
VERSION = 1  # of this wire; a peer of another is refused in the handshake

_header = struct.Struct("!IBH")
HEADER_SIZE = _header.size
NONCE_SIZE = 32
_hello = struct.Struct(f"!B{NONCE_SIZE}s")
_login = struct.Struct(f"!B{NONCE_SIZE}s32sHH")  # version, nonce, MAC, node, gateway; name
_identity = struct.Struct("!HH")
MAX_NAME = 255  # bytes of a node's name (UTF-8)
HANDSHAKE_MAX = _login.size + MAX_NAME
HANDSHAKE_TIMEOUT = 10.0  # seconds a connection may take to complete the handshake
# A batch is cut into frames of at most this many bytes of message content each
# (a larger message alone is one frame), so a frame stays far below MAX_FRAME
# and a reader never buffers a whole turn's flood at once.
FRAME_CONTENT = 16 << 20
# The largest frame after the handshake: the largest message RabbitMQ allows,
# with room for its record and the small records beside it.
MAX_FRAME = MAX_MESSAGE_SIZE_LIMIT + (64 << 20)
_BODIED = (Publish, Deliver, GetReply)


class WireError(Exception):
    """The peer broke the protocol or failed to authenticate: close the connection.
    The text says what went wrong, never with the secret."""


class Frame(NamedTuple):
    kind: int
    shard: int
    payload: bytes


class Identity(NamedTuple):
    """Who opened a link: the node (its name and number, 0 < node < 64) and which
    of its gateway processes."""

    name: str
    node: int
    gateway: int


def frame(kind: int, shard: int = 0, payload: bytes = b"") -> bytes:
    return _header.pack(len(payload), kind, shard) + payload


_revision = struct.Struct("!Q")


def revision_frame(kind: int, revision: int) -> bytes:
    """SEEN_ASK or SEEN for an etcd revision."""
    return frame(kind, 0, _revision.pack(revision))


def revision_of(got: Frame) -> int:
    if len(got.payload) != _revision.size:
        raise WireError(f"a revision of {len(got.payload)} bytes")
    return _revision.unpack(got.payload)[0]


def batch_frames(kind: int, shard: int, records: list) -> list:
    """Frames for a batch of shard records, each a list of pieces to write back to
    back (encode_batch's, behind a header): one frame unless the batch carries
    more than FRAME_CONTENT bytes of message content."""
    chunks = []
    start = size = 0
    for i, record in enumerate(records):
        if type(record) in _BODIED:
            content = len(record.body) + len(record.properties)
            if size + content > FRAME_CONTENT and i > start:
                chunks.append(records[start:i])
                start, size = i, 0
            size += content
    chunks.append(records[start:] if start else records)
    frames = []
    for chunk in chunks:
        encoded = encode_batch(chunk)
        pieces = [encoded] if type(encoded) is bytes else encoded
        length = sum(len(piece) for piece in pieces)
        frames.append([_header.pack(length, kind, shard), *pieces])
    return frames


class FrameReader:
    """Frames out of the bytes a connection received. `max_frame` may be raised
    once the handshake is done."""

    def __init__(self, max_frame: int = HANDSHAKE_MAX):
        self.max_frame = max_frame
        self._buffer = bytearray()
        self._pos = 0

    def receive_data(self, data) -> None:
        if self._pos and self._pos >= len(self._buffer) // 2:
            del self._buffer[:self._pos]  # the read frames go, in one move per half
            self._pos = 0
        self._buffer += data

    def next_frame(self) -> Frame | None:
        """The next whole frame, or None until more bytes come; WireError for a
        frame no peer of this wire sends."""
        buffer, pos = self._buffer, self._pos
        if len(buffer) - pos < HEADER_SIZE:
            return None
        length, kind, shard = _header.unpack_from(buffer, pos)
        if kind not in KINDS:
            raise WireError(f"unknown frame kind {kind}")
        if length > self.max_frame:
            raise WireError(f"frame of {length} bytes (at most {self.max_frame})")
        end = pos + HEADER_SIZE + length
        if len(buffer) < end:
            return None
        payload = bytes(buffer[pos + HEADER_SIZE:end])
        if end == len(buffer):
            buffer.clear()
            self._pos = 0
        else:
            self._pos = end
        return Frame(kind, shard, payload)


def _mac(secret: bytes, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, b"".join((label, *parts)), hashlib.sha256).digest()


def _expect(got: Frame, kind: int, name: str) -> None:
    if got.kind != kind:
        raise WireError(f"expected {name}, got a frame of kind {got.kind}")


class Acceptor:
    """Node B's side of the handshake: send `hello()`, pass the next frame to
    `login`, which returns who it is and the WELCOME to send."""

    def __init__(self, secret: bytes, nonce: bytes | None = None):
        self._secret = secret
        self.nonce = nonce if nonce is not None else secrets.token_bytes(NONCE_SIZE)

    def hello(self) -> bytes:
        return frame(HELLO, 0, _hello.pack(VERSION, self.nonce))

    def login(self, got: Frame) -> tuple[Identity, bytes]:
        _expect(got, LOGIN, "a login")
        payload = got.payload
        if len(payload) < _login.size:
            raise WireError("a login too short")
        version, nonce, mac, node, gateway = _login.unpack_from(payload)
        if version != VERSION:
            raise WireError(f"wire version {version} (this node speaks {VERSION})")
        name_bytes = payload[_login.size:]
        expected = _mac(self._secret, b"warren-link-a", self.nonce, nonce,
                        _identity.pack(node, gateway), name_bytes)
        if not hmac.compare_digest(mac, expected):
            raise WireError("wrong MAC: the peer does not know the cluster secret")
        if not 0 < node < MAX_GATEWAYS or gateway >= MAX_GATEWAYS:
            raise WireError(f"node {node} gateway {gateway} out of range")
        try:
            name = name_bytes.decode()
        except UnicodeDecodeError:
            raise WireError("a node name that is not UTF-8") from None
        welcome = frame(WELCOME, 0, _mac(self._secret, b"warren-link-b", self.nonce, nonce))
        return Identity(name, node, gateway), welcome


class Dialer:
    """Node A's side: pass the HELLO to `login`, send what it returns, then pass
    the next frame to `welcome`, which raises unless B proved it knows the secret."""

    def __init__(self, secret: bytes, identity: Identity, nonce: bytes | None = None):
        name = identity.name.encode()
        if len(name) > MAX_NAME:
            raise ValueError(f"a node name of at most {MAX_NAME} bytes")
        self._secret = secret
        self._identity = identity
        self._name = name
        self.nonce = nonce if nonce is not None else secrets.token_bytes(NONCE_SIZE)
        self._theirs = b""

    def login(self, got: Frame) -> bytes:
        _expect(got, HELLO, "a hello")
        if len(got.payload) != _hello.size:
            raise WireError("a hello of the wrong size")
        version, self._theirs = _hello.unpack(got.payload)
        if version != VERSION:
            raise WireError(f"wire version {version} (this node speaks {VERSION})")
        who = _identity.pack(self._identity.node, self._identity.gateway)
        mac = _mac(self._secret, b"warren-link-a", self._theirs, self.nonce, who, self._name)
        return frame(LOGIN, 0, _login.pack(VERSION, self.nonce, mac, self._identity.node,
                                           self._identity.gateway) + self._name)

    @property
    def greeted(self) -> bool:
        """The HELLO came (and the LOGIN is sent)."""
        return bool(self._theirs)

    def welcome(self, got: Frame) -> None:
        _expect(got, WELCOME, "a welcome")
        expected = _mac(self._secret, b"warren-link-b", self._theirs, self.nonce)
        if not self._theirs or not hmac.compare_digest(got.payload, expected):
            raise WireError("wrong MAC: the peer does not know the cluster secret")
