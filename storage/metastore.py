"""The metadata environment (DATA/meta/): vhosts, users, permissions, policies,
durable exchanges, durable queues with their placement, and bindings.

Metadata changes are rare, so each one is its own synced transaction. Values
are sealed with their checksum (storage.sealed). The counters database also
lists the shard stores this directory has had, so a store that goes missing is
noticed (storage.recovery).
"""

from __future__ import annotations

import hashlib
import os

import lmdb
import msgspec

from .queuespec import QueueSpec
from .sealed import seal, unseal
from .upgrade import MANIFEST_DB, MANIFEST_KEY, manifest_value


class ExchangeDef(msgspec.Struct):
    vhost: str
    name: str
    type: str
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: dict


class QueueDef(msgspec.Struct):
    """A durable queue: its spec and where it lives."""

    spec: QueueSpec
    qid: int
    shard: int  # the shard (and store directory shard-K) chosen at declaration


class BindingDef(msgspec.Struct):
    vhost: str
    source: str
    destination: str
    destination_type: str  # "queue" or "exchange"
    routing_key: str
    arguments: dict


class UserDef(msgspec.Struct):
    name: str
    password_hash: str
    tags: list[str] = []
    limits: dict = {}  # max-connections, max-channels


class VHostDef(msgspec.Struct):
    name: str
    description: str = ""
    limits: dict = {}  # max-connections, max-queues


class PermissionDef(msgspec.Struct):
    user: str
    vhost: str
    configure: str
    write: str
    read: str


class PolicyDef(msgspec.Struct):
    vhost: str
    name: str
    pattern: str
    apply_to: str
    priority: int
    definition: dict


class Definitions(msgspec.Struct):
    vhosts: list[VHostDef]
    users: list[UserDef]
    permissions: list[PermissionDef]
    exchanges: list[ExchangeDef]
    queues: list[QueueDef]
    bindings: list[BindingDef]
    policies: list[PolicyDef]
    next_qid: int


_KINDS = {"vhosts": VHostDef, "users": UserDef, "permissions": PermissionDef,
          "exchanges": ExchangeDef, "queues": QueueDef, "bindings": BindingDef,
          "policies": PolicyDef}
_NEXT_QID = b"next_qid"
_STORES = b"stores"
_CLUSTER_NAME = b"cluster_name"


MAX_KEY = 511  # LMDB's default largest key


def _key(*parts: str) -> bytes:
    """The parts, joined; a key LMDB cannot hold (a binding's long names, key and
    arguments) keeps its start, the vhost that deletes it by prefix, and ends in a
    digest of the whole (the value holds every part)."""
    key = "\0".join(parts).encode()
    if len(key) > MAX_KEY:
        key = key[:MAX_KEY - 64] + hashlib.sha256(key).hexdigest().encode()
    return key


class MetaStore:
    def __init__(self, path: str, map_size: int = 1 << 30, readonly: bool = False):
        if not readonly:
            os.makedirs(path, exist_ok=True)
        self.env = lmdb.open(path, map_size=map_size, subdir=True, max_dbs=len(_KINDS) + 2,
                             sync=True, readonly=readonly, create=not readonly)
        self._dbs = {kind: self.env.open_db(kind.encode(), create=not readonly)
                     for kind in (*_KINDS, "counters")}
        self._encode = msgspec.msgpack.Encoder().encode
        if not readonly:
            manifest = self.env.open_db(MANIFEST_DB)
            with self.env.begin(write=True) as txn:
                if txn.get(MANIFEST_KEY, db=manifest) is None:
                    txn.put(MANIFEST_KEY, manifest_value(), db=manifest)

    def load(self) -> Definitions:
        found = {}
        with self.env.begin() as txn:
            for kind, struct in _KINDS.items():
                decoder = msgspec.msgpack.Decoder(struct)
                found[kind] = [decoder.decode(unseal(v))
                               for _, v in txn.cursor(db=self._dbs[kind])]
            next_qid = self._counter(txn, _NEXT_QID, 1)
        return Definitions(**found, next_qid=next_qid)

    def _counter(self, txn, key: bytes, default):
        raw = txn.get(key, db=self._dbs["counters"])
        return default if raw is None else msgspec.msgpack.decode(unseal(raw))

    def allocate_qid(self) -> int:
        """A new durable queue id, never reused, even across restarts."""
        with self.env.begin(write=True) as txn:
            qid = self._counter(txn, _NEXT_QID, 1)
            txn.put(_NEXT_QID, seal(self._encode(qid + 1)), db=self._dbs["counters"])
        return qid

    def raise_next_qid(self, at_least: int) -> None:
        """The next queue id is at least `at_least` (ids already taken elsewhere)."""
        with self.env.begin(write=True) as txn:
            if self._counter(txn, _NEXT_QID, 1) < at_least:
                txn.put(_NEXT_QID, seal(self._encode(at_least)), db=self._dbs["counters"])

    def stores(self) -> set[int] | None:
        """The shard stores (K of DATA/shard-K) this directory has had; None before
        the first start that recorded them."""
        with self.env.begin() as txn:
            stores = self._counter(txn, _STORES, None)
        return None if stores is None else set(stores)

    def set_stores(self, stores: set[int]) -> None:
        self._put("counters", _STORES, sorted(stores))

    def cluster_name(self) -> str | None:
        """The name an operator gave the broker (RabbitMQ's cluster name); None: unset."""
        with self.env.begin() as txn:
            return self._counter(txn, _CLUSTER_NAME, None)

    def set_cluster_name(self, name: str) -> None:
        self._put("counters", _CLUSTER_NAME, name)

    def _put(self, kind: str, key: bytes, value) -> None:
        with self.env.begin(write=True) as txn:
            txn.put(key, seal(self._encode(value)), db=self._dbs[kind])

    def _delete(self, kind: str, key: bytes) -> None:
        with self.env.begin(write=True) as txn:
            txn.delete(key, db=self._dbs[kind])

    @staticmethod
    def _binding_key(b: BindingDef) -> bytes:
        # Identical bindings (arguments compared canonically) are one binding.
        arguments = msgspec.msgpack.encode(sorted(b.arguments.items())).hex()
        return _key(b.vhost, b.source, b.destination_type, b.destination, b.routing_key,
                    arguments)

    def put_exchange(self, e: ExchangeDef) -> None:
        self._put("exchanges", _key(e.vhost, e.name), e)

    def delete_exchange(self, vhost: str, name: str) -> None:
        self._delete("exchanges", _key(vhost, name))

    def put_queue(self, q: QueueDef) -> None:
        self._put("queues", _key(q.spec.vhost, q.spec.name), q)

    def delete_queue(self, vhost: str, name: str) -> None:
        self._delete("queues", _key(vhost, name))

    def put_binding(self, b: BindingDef) -> None:
        self._put("bindings", self._binding_key(b), b)

    def delete_binding(self, b: BindingDef) -> None:
        self._delete("bindings", self._binding_key(b))

    def put_user(self, u: UserDef) -> None:
        self._put("users", _key(u.name), u)

    def delete_user(self, name: str) -> None:
        self._delete("users", _key(name))

    def put_vhost(self, v: VHostDef) -> None:
        self._put("vhosts", _key(v.name), v)

    def delete_vhost(self, name: str) -> None:
        """Remove a vhost with everything defined in it."""
        prefix = name.encode() + b"\0"
        with self.env.begin(write=True) as txn:
            txn.delete(_key(name), db=self._dbs["vhosts"])
            for kind in ("exchanges", "queues", "bindings", "policies"):
                cursor = txn.cursor(db=self._dbs[kind])
                if cursor.set_range(prefix):
                    while cursor.key().startswith(prefix):
                        if not cursor.delete():
                            break
            cursor = txn.cursor(db=self._dbs["permissions"])
            decoder = msgspec.msgpack.Decoder(PermissionDef)
            doomed = [k for k, v in cursor if decoder.decode(unseal(v)).vhost == name]
            for key in doomed:
                txn.delete(key, db=self._dbs["permissions"])

    def put_permission(self, p: PermissionDef) -> None:
        self._put("permissions", _key(p.user, p.vhost), p)

    def delete_permission(self, user: str, vhost: str) -> None:
        self._delete("permissions", _key(user, vhost))

    def put_policy(self, p: PolicyDef) -> None:
        self._put("policies", _key(p.vhost, p.name), p)

    def delete_policy(self, vhost: str, name: str) -> None:
        self._delete("policies", _key(vhost, name))

    def close(self) -> None:
        self.env.close()
