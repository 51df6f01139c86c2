"""Where the cluster keeps things in etcd, and in what form (pure).

Under the cluster's prefix (`/warren` unless configured):

    catalogue/vhost/V              a vhost (changes.VHostPut)
    catalogue/user/U               a user with its password hash (UserPut)
    catalogue/permission/U/V       (PermissionPut)
    catalogue/policy/V/NAME        (PolicyPut)
    catalogue/exchange/V/NAME      (ExchangePut)
    catalogue/queue/V/NAME         (QueueRecord: its definition, home node, owner)
    catalogue/binding/V/SRC/T/DST/KEY/ARGS   (BindingPut)
    nodes/NAME                     a running node (NodeInfo), under its lease
    numbers/NAME                   a node's number, kept for ever
    next-number                    the next number to give a node
    secret                         the link's shared secret, unless configured
    groups/V/NAME/leader           a replica group's leader (Leader), under its lease
    groups/V/NAME/isr              its in-sync members (InSync), written by the leader

Names are percent-encoded, so a '/' in a queue name cannot reach another key. A
catalogue value is the change record that puts the object (broker/changes.py),
msgpack-encoded: replaying a key's value on a catalogue builds that object, and
a deleted key is the matching record of removal. One object, one key: a
declaration's transaction compares exactly the keys it writes.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

import msgspec
import xxhash

from warren.storage.metastore import QueueDef

from ..broker import changes as c
from ..broker.exchange import arguments_key


class QueueRecord(msgspec.Struct, array_like=True, tag=7):
    """A queue as etcd holds it: its definition with the shard of its home node,
    that node, the owner of an exclusive queue (a connection of `owner_node`), and
    a replicated quorum queue's members (its first is the home node; empty for
    any other queue)."""

    definition: QueueDef
    node: str
    owner: int = 0
    owner_node: str = ""
    members: list[str] = []


class NodeInfo(msgspec.Struct):
    """A running node, as it registers itself (under its lease)."""

    name: str
    number: int
    link: str  # host:port of its inter-node link
    amqp: str  # host:port of its AMQP listener
    management: str  # host:port of its management API ("" if none)
    shards: int
    started: float  # seconds since the epoch


class Leader(msgspec.Struct):
    """A replica group's leader; the key's create_revision is its epoch."""

    node: str


class InSync(msgspec.Struct):
    """A replica group's in-sync members, as the leader of `epoch` wrote them
    (epoch 0: the group's creation, every member)."""

    nodes: list[str]
    epoch: int


Record = c.VHostPut | c.UserPut | c.PermissionPut | c.PolicyPut | c.ExchangePut | \
    QueueRecord | c.BindingPut

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Record)

# The kinds in the order a catalogue is built in: what an object needs comes first.
KINDS = ("vhost", "user", "permission", "policy", "exchange", "queue", "binding")


class Layout:
    """The keys of one cluster (its prefix)."""

    def __init__(self, prefix: str = "/warren"):
        self.prefix = prefix.rstrip("/").encode()
        self.catalogue = self.prefix + b"/catalogue/"
        self.nodes = self.prefix + b"/nodes/"
        self.numbers = self.prefix + b"/numbers/"
        self.next_number = self.prefix + b"/next-number"
        self.secret = self.prefix + b"/secret"

    def node(self, name: str) -> bytes:
        return self.nodes + _q(name)

    def number(self, name: str) -> bytes:
        return self.numbers + _q(name)

    def key(self, kind: str, *parts: str) -> bytes:
        return self.catalogue + kind.encode() + b"/" + b"/".join(_q(p) for p in parts)

    def kind_of(self, key: bytes) -> str:
        return key[len(self.catalogue):].split(b"/", 1)[0].decode()

    def key_of(self, record) -> bytes:
        """The key a catalogue record (a put, or the matching removal) lives at."""
        kind = type(record)
        if kind is c.VHostPut:
            return self.key("vhost", record.definition.name)
        if kind is c.VHostDeleted:
            return self.key("vhost", record.name)
        if kind is c.UserPut:
            return self.key("user", record.definition.name)
        if kind is c.UserDeleted:
            return self.key("user", record.name)
        if kind is c.PermissionPut:
            return self.key("permission", record.definition.user, record.definition.vhost)
        if kind is c.PermissionDeleted:
            return self.key("permission", record.user, record.vhost)
        if kind is c.PolicyPut:
            return self.key("policy", record.policy.vhost, record.policy.name)
        if kind is c.PolicyDeleted:
            return self.key("policy", record.vhost, record.name)
        if kind is c.ExchangePut:
            return self.key("exchange", record.definition.vhost, record.definition.name)
        if kind is c.ExchangeDeleted:
            return self.key("exchange", record.vhost, record.name)
        if kind is QueueRecord:
            spec = record.definition.spec
            return self.key("queue", spec.vhost, spec.name)
        if kind is c.BindingPut or kind is c.BindingDeleted:
            b = record.definition
            return self.key("binding", b.vhost, b.source, b.destination_type, b.destination,
                            b.routing_key, _arguments_digest(b.arguments))
        raise TypeError(f"not a catalogue record: {kind.__name__}")

    def queue_key(self, vhost: str, name: str) -> bytes:
        return self.key("queue", vhost, name)

    @property
    def groups(self) -> bytes:
        return self.prefix + b"/groups/"

    def group_key(self, vhost: str, name: str) -> bytes:
        """The base of a replica group's keys (its `leader` and `isr` follow)."""
        return self.groups + _q(vhost) + b"/" + _q(name) + b"/"

    def group_leader(self, vhost: str, name: str) -> bytes:
        return self.group_key(vhost, name) + b"leader"

    def group_isr(self, vhost: str, name: str) -> bytes:
        return self.group_key(vhost, name) + b"isr"

    def group_of(self, key: bytes) -> tuple[str, str, str] | None:
        """(vhost, name, "leader" or "isr") of a group's key, None for any other."""
        if not key.startswith(self.groups):
            return None
        parts = key[len(self.groups):].split(b"/")
        if len(parts) != 3 or parts[2] not in (b"leader", b"isr"):
            return None
        return unq(parts[0]), unq(parts[1]), parts[2].decode()


def encode(record) -> bytes:
    return _encoder.encode(record)


def decode(value: bytes):
    return _decoder.decode(value)


def encode_node(info: NodeInfo) -> bytes:
    return msgspec.json.encode(info)


def decode_node(value: bytes) -> NodeInfo:
    return msgspec.json.decode(value, type=NodeInfo)


def encode_group(value: Leader | InSync) -> bytes:
    return msgspec.json.encode(value)


def decode_leader(value: bytes) -> Leader:
    return msgspec.json.decode(value, type=Leader)


def decode_in_sync(value: bytes) -> InSync:
    return msgspec.json.decode(value, type=InSync)


def removal(layout: Layout, key: bytes, record):
    """The change record that removes what `record` (the key's last value) put."""
    kind = type(record)
    if kind is c.VHostPut:
        return c.VHostDeleted(record.definition.name)
    if kind is c.UserPut:
        return c.UserDeleted(record.definition.name)
    if kind is c.PermissionPut:
        return c.PermissionDeleted(record.definition.user, record.definition.vhost)
    if kind is c.PolicyPut:
        return c.PolicyDeleted(record.policy.vhost, record.policy.name)
    if kind is c.ExchangePut:
        return c.ExchangeDeleted(record.definition.vhost, record.definition.name)
    if kind is c.BindingPut:
        return c.BindingDeleted(record.definition)
    if kind is QueueRecord:
        return record  # the caller forgets the queue this record names
    raise TypeError(f"not a catalogue record: {kind.__name__}")


def _q(part: str) -> bytes:
    return quote(part, safe="").encode()


def unq(part: bytes) -> str:
    return unquote(part.decode())


def _arguments_digest(arguments: dict) -> str:
    """Binding arguments in a key: a digest of their canonical form."""
    return xxhash.xxh64_hexdigest(arguments_key(arguments).encode()) if arguments else "-"
