"""Definitions export and import in RabbitMQ's format (users, vhosts, permissions,
policies, durable queues, exchanges and bindings), so they move between brokers:
GET and POST /api/definitions[/{vhost}]. An import is checked whole before
anything changes: every problem is reported with its place in the document, and a
document with any problem changes nothing."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

import msgspec

from warren.storage.metastore import PolicyDef
from warren.storage.queuespec import QueueSpec

from .. import __version__
from ..broker import patterns, policies, rules
from ..broker.exchange import EXCHANGE, QUEUE, Exchange
from ..errors import AMQPError
from . import limits, supported
from .http import MAX_NAME, HTTPError, Request, Response
from .rights import require_admin
from .shapes import COMPATIBLE_RABBITMQ

SHA256 = "rabbit_password_hashing_sha256"
# Seconds an import works before it lets the loop serve everyone else a turn: a
# 20,000-queue import takes seconds, longer than a client's handshake may wait.
SLICE = 0.01


def export(gateway) -> dict:
    access, catalogue = gateway.access, gateway.catalogue
    queues, exchanges, bindings = [], [], []
    for vhost_name, vhost in sorted(catalogue.vhosts.items()):
        for name, meta in sorted(vhost.queues.items()):
            if meta.spec.stored:
                queues.append({"name": name, "vhost": vhost_name, "durable": True,
                               "auto_delete": meta.spec.auto_delete,
                               "arguments": meta.spec.arguments})
        for name, exchange in sorted(vhost.exchanges.items()):
            if name and not name.startswith("amq.") and exchange.durable:
                exchanges.append({"name": name, "vhost": vhost_name, "type": exchange.type,
                                  "durable": True, "auto_delete": exchange.auto_delete,
                                  "internal": exchange.internal,
                                  "arguments": exchange.arguments})
            if not name:
                continue
            for (destination, routing_key, _), args in exchange.bindings.items():
                if not (_exported(vhost, EXCHANGE, name) and _exported(vhost, *destination)):
                    continue  # an import would refuse a binding whose end it lacks
                bindings.append({"source": name, "vhost": vhost_name,
                                 "destination": destination[1],
                                 "destination_type": destination[0],
                                 "routing_key": routing_key, "arguments": args})
    return {
        "rabbit_version": COMPATIBLE_RABBITMQ, "rabbitmq_version": COMPATIBLE_RABBITMQ,
        "product_name": "Warren", "product_version": __version__,
        "users": [{"name": u.name, "password_hash": u.password_hash,
                   "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": u.tags,
                   "limits": u.limits} for _, u in sorted(access.users.items())],
        "vhosts": [{"name": name, "description": d.description, "limits": d.limits,
                    "metadata": {"description": d.description, "tags": []}}
                   for name, d in sorted(catalogue.vhost_defs.items())],
        "permissions": [{"user": p.user, "vhost": p.vhost, "configure": p.configure,
                         "write": p.write, "read": p.read}
                        for _, p in sorted(access.permissions.items())],
        "topic_permissions": [], "global_parameters": [],
        # vhost limits where RabbitMQ keeps them (its import reads them there)
        "parameters": [{"value": d.limits, "vhost": name, "component": "vhost-limits",
                        "name": "limits"} for name, d in sorted(catalogue.vhost_defs.items())
                       if d.limits],
        "policies": [{"vhost": p.vhost, "name": p.name, "pattern": p.pattern,
                      "apply-to": p.apply_to, "definition": p.definition,
                      "priority": p.priority}
                     for v in sorted(catalogue.policies)
                     for _, p in sorted(catalogue.policies[v].items())],
        "queues": queues, "exchanges": exchanges, "bindings": bindings,
    }


# What RabbitMQ's exports (3.x and 4.x) hold, field by field. Warren keeps what it
# has a use for; the rest is checked and ignored.
_Limits = dict[str, int] | Annotated[list, msgspec.Meta(max_length=0)]  # RabbitMQ: [] for none
_Arguments = dict[str, Any]


class _Item(msgspec.Struct, forbid_unknown_fields=True):
    pass


class UserItem(_Item):
    name: str
    password_hash: str = ""
    hashing_algorithm: str = SHA256
    tags: list[str] | str = []  # a comma-separated string before RabbitMQ 3.9
    limits: _Limits = {}


class VHostMetadata(msgspec.Struct, frozen=True):  # open: RabbitMQ adds keys over versions
    description: str = ""
    tags: list[str] = []
    default_queue_type: str = "classic"


class VHostItem(_Item):
    name: str
    description: str = ""
    tags: list[str] = []
    default_queue_type: str = "classic"
    metadata: VHostMetadata = VHostMetadata()
    limits: _Limits = {}
    tracing: bool = False


class PermissionItem(_Item):
    user: str
    vhost: str
    configure: str = ""
    write: str = ""
    read: str = ""


class TopicPermissionItem(_Item):
    user: str
    vhost: str
    exchange: str
    write: str = ""
    read: str = ""


class ParameterItem(_Item):
    vhost: str
    component: str
    name: str
    value: Any


class GlobalParameterItem(_Item):
    name: str
    value: Any


class PolicyItem(_Item):
    vhost: str
    name: str
    pattern: str
    definition: dict[str, Any]
    apply_to: str = msgspec.field(name="apply-to", default="all")
    priority: int = 0


class ExchangeItem(_Item):
    name: str
    vhost: str
    type: str = "direct"
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: _Arguments = {}


class QueueItem(_Item):
    name: str
    vhost: str
    type: str = "classic"  # RabbitMQ 4 writes it beside x-queue-type
    durable: bool = True
    auto_delete: bool = False
    arguments: _Arguments = {}


class BindingItem(_Item):
    source: str
    vhost: str
    destination: str
    destination_type: Literal["queue", "exchange"] = "queue"
    routing_key: str = ""
    arguments: _Arguments = {}


SECTIONS = {"users": UserItem, "vhosts": VHostItem, "permissions": PermissionItem,
            "topic_permissions": TopicPermissionItem, "parameters": ParameterItem,
            "global_parameters": GlobalParameterItem, "policies": PolicyItem,
            "queues": QueueItem, "exchanges": ExchangeItem, "bindings": BindingItem}
ABOUT = {"rabbit_version", "rabbitmq_version", "product_name", "product_version",
         "rabbitmq_definition_format", "original_cluster_name", "explanation"}


class Invalid(Exception):
    """The document has problems, or holds what Warren does not support (and the
    import was not told to skip that): nothing was changed."""

    def __init__(self, problems: list[str], unsupported: list[str] = ()):
        super().__init__(f"{len(problems)} problem(s), {len(unsupported)} unsupported")
        self.problems = problems
        self.unsupported = list(unsupported)


def _exported(vhost, kind: str, name: str) -> bool:
    """Is the queue or exchange in an export (or in every vhost, as amq.* are)?
    Transient ones are not: they would not outlive a restart either."""
    if kind == QUEUE:
        meta = vhost.queues.get(name)
        return meta is not None and meta.spec.stored
    exchange = vhost.exchanges.get(name)
    return exchange is not None and (exchange.durable or name.startswith("amq."))


# What a vhost's export holds, as RabbitMQ's GET /api/definitions/{vhost}: its
# objects, the queues, exchanges and bindings without their vhost field (an
# import into a vhost places them there).
VHOST_SECTIONS = ("parameters", "policies", "queues", "exchanges", "bindings")
UNPLACED = ("queues", "exchanges", "bindings")


def export_vhost(gateway, vhost: str) -> dict:
    document = export(gateway)
    return {"rabbit_version": document["rabbit_version"], **{
        section: [{k: v for k, v in item.items() if k != "vhost" or section not in UNPLACED}
                  for item in document.get(section, []) if item.get("vhost") == vhost]
        for section in VHOST_SECTIONS}}


def into_vhost(data, vhost: str):
    """A vhost's export as the whole broker's: its objects, each in `vhost`."""
    if not isinstance(data, dict):
        return data  # import_ says what is wrong with it
    return {**data, **{section: [{**item, "vhost": vhost} if isinstance(item, dict) else item
                                 for item in data[section]]
                       for section in VHOST_SECTIONS if isinstance(data.get(section), list)}}


async def import_(gateway, data, skip_unsupported: bool = False) -> list[str]:
    """Create what the definitions name and Warren lacks (existing objects stay;
    users, permissions, policies and limits are set). Returns what was skipped as
    unsupported. Raises Invalid, having changed nothing, when the document has
    problems, or unsupported items and skip_unsupported is false. It yields to
    the loop as it goes; a change made meanwhile that the rest of the document
    no longer fits (a vhost deleted) stops it there, with what was applied kept."""
    if not isinstance(data, dict):
        raise Invalid(["the definitions: expected an object"])
    loaded, problems = _load(data)
    unsupported = supported.unsupported(loaded)
    supported.drop(loaded)  # what is left is checked: each problem is reported once
    problems += _unresolved(gateway, data, loaded)
    if problems or (unsupported and not skip_unsupported):
        raise Invalid(problems, [] if skip_unsupported else unsupported)
    try:
        await _apply(gateway, loaded)
    except AMQPError as error:
        raise Invalid([f"changed while importing, stopped partway: {error.text}"]) from None
    return unsupported if skip_unsupported else []


async def definitions(management, request: Request, rest: list[str]) -> Response:
    """GET and POST /api/definitions: the whole broker's, or one vhost's
    (/api/definitions/{vhost})."""
    require_admin(request)
    gateway = management.gateway
    vhost = rest[0] if rest else None
    if vhost is not None and vhost not in gateway.catalogue.vhosts:  # RabbitMQ's answers
        raise (HTTPError(400, "bad_request", "vhost_not_found") if request.method == "GET"
               else HTTPError(404, "not_found", "vhost_not_found"))
    if request.method == "GET":
        return Response.json(export(gateway) if vhost is None else export_vhost(gateway, vhost))
    # POST; skip-unsupported=true: import what Warren supports, list what it skipped
    skip = request.query.get("skip-unsupported") == "true"
    data = request.json() if vhost is None else into_vhost(request.json(), vhost)
    try:
        skipped = await import_(gateway, data, skip)
    except Invalid as error:
        reason = ("invalid definitions, nothing imported" if error.problems else
                  "the definitions hold what Warren does not support, nothing "
                  "imported (skip-unsupported=true imports the rest)")
        return Response.json({"error": "bad_request", "reason": reason,
                              "problems": error.problems + error.unsupported,
                              "unsupported": error.unsupported}, 400)
    return Response.json({"skipped": skipped}) if skipped else Response(204)


async def _apply(gateway, loaded: dict[str, list]) -> None:
    access = gateway.access
    turn = _Turns()
    for _, v in loaded["vhosts"]:
        if v.name not in gateway.catalogue.vhosts:
            gateway.catalogue.add_vhost(v.name, v.description or v.metadata.description,
                                        v.limits or {})
    for _, p in loaded["parameters"]:  # vhost-limits, as RabbitMQ sets them: the whole set
        gateway.catalogue.add_vhost(p.vhost, gateway.catalogue.vhost_defs[p.vhost].description,
                                    p.value)
    for _, u in loaded["users"]:
        tags = [t for t in u.tags.split(",") if t] if isinstance(u.tags, str) else u.tags
        access.put_user(u.name, None, tags, u.password_hash, u.limits or {})
    for _, p in loaded["permissions"]:
        access.set_permissions(p.user, p.vhost, p.configure, p.write, p.read)
    for _, p in loaded["policies"]:
        await turn()
        if p.vhost not in gateway.catalogue.vhosts:
            raise AMQPError(404, f"no vhost '{p.vhost}'")
        gateway.catalogue.put_policy(_policy(p))
    for _, x in loaded["exchanges"]:
        await turn()
        if x.name not in _vhost(gateway, x.vhost).exchanges:
            rules.declare_exchange(gateway.catalogue, _exchange(x))
    for _, q in loaded["queues"]:
        await turn()
        if q.name not in _vhost(gateway, q.vhost).queues:
            rules.declare_queue(gateway.catalogue, _queue_spec(q))
    for _, b in loaded["bindings"]:
        await turn()
        rules.bind(gateway.catalogue, b.vhost, b.source,
                   (_KINDS[b.destination_type], b.destination), b.routing_key, b.arguments)


class _Turns:
    """Awaited before each step: gives the loop a turn every SLICE seconds."""

    def __init__(self):
        self.loop = asyncio.get_running_loop()
        self.until = self.loop.time() + SLICE

    async def __call__(self) -> None:
        if self.loop.time() >= self.until:
            await asyncio.sleep(0)
            self.until = self.loop.time() + SLICE


def _vhost(gateway, name: str):
    vhost = gateway.catalogue.vhosts.get(name)
    if vhost is None:
        raise AMQPError(404, f"no vhost '{name}'")
    return vhost


_KINDS = {"queue": QUEUE, "exchange": EXCHANGE}


def _load(data: dict) -> tuple[dict[str, list], list[str]]:
    """The document's well-formed items, typed, with their places in their
    sections, and the problems of the others."""
    loaded = {section: [] for section in SECTIONS}
    problems = [f"{key}: unknown key" for key in data if key not in SECTIONS and key not in ABOUT]
    for section, kind in SECTIONS.items():
        items = data.get(section, [])
        if not isinstance(items, list):
            problems.append(f"{section}: expected an array")
            continue
        for index, item in enumerate(items):
            found = _shape_problems(item, kind)
            problems += [f"{section}[{index}]{problem}" for problem in found]
            if not found:
                loaded[section].append((index, msgspec.convert(item, kind)))
    return loaded, problems


def _shape_problems(item, kind) -> list[str]:
    """Every field's problem (msgspec would stop at the first)."""
    if not isinstance(item, dict):
        return [": expected an object"]
    fields = {f.encode_name: f for f in msgspec.structs.fields(kind)}
    problems = [f".{key}: unknown key" for key in item if key not in fields]
    for name, field in fields.items():
        if name not in item:
            if field.required:
                problems.append(f".{name}: missing")
            continue
        try:
            msgspec.convert(item[name], field.type)
        except msgspec.ValidationError as error:
            message, _, where = str(error).partition(" - at `$")
            problems.append(f".{name}{where.rstrip('`')}: {message[0].lower()}{message[1:]}")
    return problems


def _unresolved(gateway, data: dict, loaded: dict[str, list]) -> list[str]:
    """What the well-formed items name and neither Warren nor the document has,
    and values Warren would refuse."""
    problems = []
    vhosts = set(gateway.catalogue.vhosts) | {name for name, in _declared(data, "vhosts", "name")}
    users = set(gateway.access.users) | {name for name, in _declared(data, "users", "name")}
    exchanges = _declared(data, "exchanges", "vhost", "name")
    queues = _declared(data, "queues", "vhost", "name")
    for vhost in gateway.catalogue.vhosts.values():
        exchanges |= {(vhost.name, name) for name in vhost.exchanges}
        queues |= {(vhost.name, name) for name in vhost.queues}
    for section in ("permissions", "policies", "exchanges", "queues", "bindings"):
        problems += [f"{section}[{i}].vhost: no vhost '{item.vhost}'"
                     for i, item in loaded[section] if item.vhost not in vhosts]
    for section in ("users", "vhosts", "policies", "exchanges", "queues"):
        for i, item in loaded[section]:
            size = len(item.name.encode())
            if size == 0 and section in ("users", "vhosts"):  # the stores cannot key ""
                problems.append(f"{section}[{i}].name: should not be empty")
            elif size > MAX_NAME:
                problems.append(f"{section}[{i}].name: should be less than {MAX_NAME} bytes, "
                                f"actually was {size}")
    for i, u in loaded["users"]:
        if u.hashing_algorithm != SHA256:
            problems.append(f"users[{i}].hashing_algorithm: {u.hashing_algorithm} is not "
                            f"supported (only {SHA256})")
    for i, p in loaded["permissions"]:
        if p.user not in users:
            problems.append(f"permissions[{i}].user: no user '{p.user}'")
        for access in ("configure", "write", "read"):
            problem = patterns.problem(getattr(p, access))
            if problem:
                problems.append(f"permissions[{i}].{access}: invalid regular expression "
                                f"'{getattr(p, access)}': {problem}")
    for i, p in loaded["parameters"]:
        if p.component != supported.VHOST_LIMITS:
            continue  # reported as unsupported
        if p.vhost not in vhosts:
            problems.append(f"parameters[{i}].vhost: no vhost '{p.vhost}'")
        problem = limits.problem(p.value, limits.VHOST_LIMITS)
        if problem:
            problems.append(f"parameters[{i}].value: {problem}")
    for section, known in (("vhosts", limits.VHOST_LIMITS), ("users", limits.USER_LIMITS)):
        for i, item in loaded[section]:
            problem = limits.problem(item.limits or {}, known)
            if problem:
                problems.append(f"{section}[{i}].limits: {problem}")
    for i, p in loaded["policies"]:
        problem = policies.problems(_policy(p))
        if problem:
            problems.append(f"policies[{i}]: {problem}")
    for i, x in loaded["exchanges"]:
        problem = _refusal(rules.check_exchange, _exchange(x))
        if problem:
            problems.append(f"exchanges[{i}]: {problem}")
    for i, q in loaded["queues"]:
        problem = _refusal(rules.check_queue, gateway.catalogue, _queue_spec(q))
        if problem:
            problems.append(f"queues[{i}]: {problem}")
    for i, b in loaded["bindings"]:
        if b.source == "" or (b.vhost, b.source) not in exchanges:
            problems.append(f"bindings[{i}].source: no exchange '{b.source}' in vhost "
                            f"'{b.vhost}'")
        targets = queues if b.destination_type == "queue" else exchanges
        if (b.vhost, b.destination) not in targets:
            problems.append(f"bindings[{i}].destination: no {b.destination_type} "
                            f"'{b.destination}' in vhost '{b.vhost}'")
    return problems


def _declared(data: dict, section: str, *keys: str) -> set[tuple]:
    """The keys (vhost, name...) of a section's items, also of those with problems:
    those are reported once, not again by every reference to them."""
    items = data.get(section)
    if not isinstance(items, list):
        return set()
    return {tuple(item[key] for key in keys) for item in items
            if isinstance(item, dict) and all(isinstance(item.get(key), str) for key in keys)}


def _refusal(checker, *args) -> str | None:
    try:
        checker(*args)
    except AMQPError as error:
        return error.text
    return None


def _policy(p: PolicyItem) -> PolicyDef:
    return PolicyDef(p.vhost, p.name, p.pattern, p.apply_to, p.priority, p.definition)


def _queue_spec(q: QueueItem) -> QueueSpec:
    arguments = q.arguments
    if q.type != "classic" and "x-queue-type" not in arguments:
        arguments = {**arguments, "x-queue-type": q.type}
    return QueueSpec(q.vhost, q.name, q.durable, False, q.auto_delete, arguments)


def _exchange(x: ExchangeItem) -> Exchange:
    return Exchange(x.vhost, x.name, x.type, x.durable, x.auto_delete, x.internal, x.arguments)
