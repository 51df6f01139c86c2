"""The catalogue shared by every gateway process: what changes, as records, and
how another gateway replays them.

Gateway 0 is the metadata authority (docs/architecture.md, "Many gateways"): it
alone changes the catalogue and writes DATA/meta/. Each change is recorded
where it happens, at the lowest level (a binding added, an exchange removed),
so the other gateways replay the records in order through the same Catalogue
(catalogue.py) and AccessControl methods and end with the same vhosts,
exchanges, bindings, queues (with their placement and exclusive owner),
policies, users and permissions. A gateway that starts is sent the whole
catalogue as such records first (`snapshot`).
"""

from __future__ import annotations

from typing import Union

import msgspec

from warren.storage.metastore import (
    BindingDef,
    ExchangeDef,
    PermissionDef,
    PolicyDef,
    QueueDef,
    UserDef,
    VHostDef,
)

from .exchange import Exchange


class _Change(msgspec.Struct, array_like=True, tag=True):
    pass


class VHostPut(_Change, tag=1):
    definition: VHostDef


class VHostDeleted(_Change, tag=2):
    name: str


class PolicyPut(_Change, tag=3):
    policy: PolicyDef


class PolicyDeleted(_Change, tag=4):
    vhost: str
    name: str


class ExchangePut(_Change, tag=5):
    definition: ExchangeDef


class ExchangeDeleted(_Change, tag=6):
    vhost: str
    name: str


class QueuePut(_Change, tag=7):
    definition: QueueDef
    owner: int  # the owning connection's id of an exclusive queue, else 0


class QueueForgotten(_Change, tag=8):
    qid: int


class BindingPut(_Change, tag=9):
    definition: BindingDef


class BindingDeleted(_Change, tag=10):
    definition: BindingDef


class UserPut(_Change, tag=11):
    definition: UserDef


class UserDeleted(_Change, tag=12):
    name: str


class PermissionPut(_Change, tag=13):
    definition: PermissionDef


class PermissionDeleted(_Change, tag=14):
    user: str
    vhost: str


Change = Union[VHostPut, VHostDeleted, PolicyPut, PolicyDeleted, ExchangePut, ExchangeDeleted,
               QueuePut, QueueForgotten, BindingPut, BindingDeleted, UserPut, UserDeleted,
               PermissionPut, PermissionDeleted]


def exchange_def(exchange: Exchange) -> ExchangeDef:
    return ExchangeDef(exchange.vhost, exchange.name, exchange.type, exchange.durable,
                       exchange.auto_delete, exchange.internal, exchange.arguments)


def binding_def(exchange: Exchange, destination: tuple, routing_key: str,
                arguments: dict) -> BindingDef:
    return BindingDef(exchange.vhost, exchange.name, destination[1], destination[0],
                      routing_key, arguments)


def snapshot(catalogue, access) -> list:
    """The whole catalogue (a catalogue.Catalogue) with its users and permissions
    (an access.AccessControl) as changes that build it on an empty one (a vhost's
    predeclared exchanges come again, the same)."""
    changes: list = [VHostPut(d) for d in catalogue.vhost_defs.values()]
    changes += [UserPut(u) for u in access.users.values()]
    changes += [PermissionPut(p) for p in access.permissions.values()]
    changes += [PolicyPut(p) for named in catalogue.policies.values() for p in named.values()]
    bindings = []
    for vhost in catalogue.vhosts.values():
        for exchange in vhost.exchanges.values():
            changes.append(ExchangePut(exchange_def(exchange)))
            bindings += [BindingPut(binding_def(exchange, destination, routing_key, arguments))
                         for (destination, routing_key, _), arguments
                         in exchange.bindings.items()]
        changes += [QueuePut(QueueDef(meta.spec, meta.qid, meta.shard),
                             meta.owner.id if meta.owner is not None else 0)
                    for meta in vhost.queues.values()]
    return changes + bindings


def apply(catalogue, access, owner_of, change) -> None:
    """Replay one change of the authority's catalogue on a Catalogue and its
    AccessControl; `owner_of(id)` is the owner an exclusive queue's owner id names
    (registry.Registry.owner_of)."""
    kind = type(change)
    if kind is BindingPut or kind is BindingDeleted:
        b = change.definition
        vhost = catalogue.vhosts.get(b.vhost)
        exchange = vhost.exchanges.get(b.source) if vhost else None
        if exchange is None:
            return
        destination = (b.destination_type, b.destination)
        if kind is BindingPut:
            catalogue.add_binding(vhost, exchange, destination, b.routing_key, b.arguments)
        else:
            catalogue.unbind(exchange, destination, b.routing_key, b.arguments,
                             auto_delete=False)
    elif kind is QueuePut:
        catalogue.add_queue(change.definition, owner_of(change.owner))
    elif kind is QueueForgotten:
        meta = catalogue.queues_by_qid.get(change.qid)
        if meta is not None:
            catalogue.forget_queue(meta)
    elif kind is ExchangePut:
        e = change.definition
        catalogue.add_exchange(Exchange(e.vhost, e.name, e.type, e.durable, e.auto_delete,
                                        e.internal, e.arguments))
    elif kind is ExchangeDeleted:
        vhost = catalogue.vhosts.get(change.vhost)
        exchange = vhost.exchanges.get(change.name) if vhost else None
        if exchange is not None:
            catalogue.delete_exchange(exchange)
    elif kind is VHostPut:
        d = change.definition
        catalogue.add_vhost(d.name, d.description, d.limits)
    elif kind is VHostDeleted:
        catalogue.delete_vhost(change.name)
    elif kind is PolicyPut:
        catalogue.put_policy(change.policy)
    elif kind is PolicyDeleted:
        catalogue.delete_policy(change.vhost, change.name)
    elif kind is UserPut:
        u = change.definition
        access.put_user(u.name, None, u.tags, u.password_hash, u.limits)
    elif kind is UserDeleted:
        access.delete_user(change.name)
    elif kind is PermissionPut:
        p = change.definition
        access.set_permissions(p.user, p.vhost, p.configure, p.write, p.read)
    elif kind is PermissionDeleted:
        access.clear_permissions(change.user, change.vhost)


class NoStore:
    """The metadata store of a gateway that is not the authority: gateway 0 writes
    DATA/meta/, the others replay its changes and store nothing."""

    def put_vhost(self, *_) -> None: pass
    def delete_vhost(self, *_) -> None: pass
    def put_policy(self, *_) -> None: pass
    def delete_policy(self, *_) -> None: pass
    def put_queue(self, *_) -> None: pass
    def delete_queue(self, *_) -> None: pass
    def put_exchange(self, *_) -> None: pass
    def delete_exchange(self, *_) -> None: pass
    def put_binding(self, *_) -> None: pass
    def delete_binding(self, *_) -> None: pass
    def close(self) -> None: pass
