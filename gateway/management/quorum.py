"""Warren's own routes for a quorum queue's members: GET /api/quorum-status/V/NAME,
one row per member as `rabbitmq-queues quorum_status` prints them (what `warren
ctl quorum_status` shows; the indexes are the leader's shard's: its own log's
last index and the durable index each follower acknowledged); POST and DELETE
/api/quorum-members/V/NAME/NODE add and remove a member (`warren ctl add_member`,
`delete_member`), answered with RabbitMQ's errors; POST /api/quorum-grow/NODE and
/api/quorum-shrink/NODE add it to or remove it from many queues (`warren ctl grow`,
`shrink`), answered with a row per queue as rabbitmq-queues prints them."""

from __future__ import annotations

import re

from .http import Request, Response, bad_request, flag, not_found
from .rights import require_admin


async def quorum_status(management, request: Request, rest: list[str]) -> Response:
    vhost = management.vhost_named(request, rest[0])
    meta = vhost.queues.get(rest[1])
    if meta is None:
        raise not_found()
    kind = meta.spec.queue_type
    if kind != "quorum":
        raise bad_request(f"Cannot get quorum status of a {kind} queue")
    group = management.replica_group(meta)
    if group is None:  # not replicated (alone, or declared before a cluster): its node leads
        return Response.json([_row(management.node_of(meta), "leader", None, None, True)])
    leader = group["leader"]
    held = await _leader_indexes(management, meta) if leader else None
    if held and len(held) - 2 != len(group["members"]):
        held = None  # the leader's shard not yet told of a member change
    commit, indexes = (held[1], dict(zip(sorted(group["members"]), held[2:]))) \
        if held else (None, {})
    rows = []
    for node in group["members"]:
        state = "leader" if node == leader else \
            "follower" if node in group["online"] else "noproc"
        index = indexes.get(node)
        rows.append(_row(node, state, index, None if index is None else min(index, commit),
                         node in group["in_sync"]))
    return Response.json(rows)


async def quorum_members(management, request: Request, rest: list[str]) -> Response:
    require_admin(request)
    vhost = management.vhost_named(request, rest[0])
    meta = vhost.queues.get(rest[1])
    if meta is None:
        raise not_found()
    add = request.method == "POST"
    kind = meta.spec.queue_type
    if kind != "quorum":
        raise bad_request(f"Cannot add members to a {kind} queue" if add
                          else f"Cannot remove members from a {kind} queue")
    cluster = management.gateway.cluster
    if cluster is None:
        raise bad_request("node_not_running")
    if management.replica_group(meta) is None:
        raise bad_request(f"queue '{meta.spec.name}' in vhost '{vhost.name}' is not replicated "
                          "(declared before its node joined a cluster)")
    error = await cluster.replicas.change_members(vhost.name, meta.spec.name, rest[2], add)
    if error == "not_found":
        raise not_found()
    if error:
        raise bad_request(error)
    return Response(204)


async def quorum_grow(management, request: Request, rest: list[str]) -> Response:
    """Adds the node to every replicated quorum queue the patterns match (all,
    or those with an even number of members) that lacks it."""
    require_admin(request)
    body = request.json()
    strategy = body.get("strategy", "all")
    if strategy not in ("all", "even"):
        raise bad_request(f"strategy '{strategy}' is not recognised.")
    try:
        vhosts = re.compile(str(body.get("vhost_pattern", ".*")))
        names = re.compile(str(body.get("queue_pattern", ".*")))
    except re.error as error:
        raise bad_request(f"invalid pattern: {error}") from None
    node = rest[0]
    rows = []
    for meta, group in _groups(management):
        members = group["members"]
        if node in members or (strategy == "even" and len(members) % 2) or \
                not vhosts.search(meta.spec.vhost) or not names.search(meta.spec.name):
            continue
        error = await management.gateway.cluster.replicas.change_members(
            meta.spec.vhost, meta.spec.name, node, True)
        rows.append(_changed(meta, len(members) + (not error), error))
    return Response.json(rows)


async def quorum_shrink(management, request: Request, rest: list[str]) -> Response:
    """Removes the node from every replicated quorum queue it is a member of."""
    require_admin(request)
    errors_only = flag(request.json(), "errors_only", False)
    node = rest[0]
    rows = []
    for meta, group in _groups(management):
        members = group["members"]
        if node not in members:
            continue
        error = await management.gateway.cluster.replicas.change_members(
            meta.spec.vhost, meta.spec.name, node, False)
        if error == "last_node":
            error = "the last node cannot be removed"
        if error or not errors_only:
            rows.append(_changed(meta, len(members) - (not error), error))
    return Response.json(rows)


def _groups(management):
    """Every replicated quorum queue, with its group as the API shows it."""
    if management.gateway.cluster is None:
        return
    for _, vhost in sorted(management.gateway.catalogue.vhosts.items()):
        for _, meta in sorted(vhost.queues.items()):
            group = management.replica_group(meta)
            if group is not None:
                yield meta, group


def _changed(meta, size: int, error: str) -> dict:
    return {"vhost": meta.spec.vhost, "name": meta.spec.name, "size": size,
            "result": f"error: {error}" if error else "ok"}


def _row(node: str, state: str, log_index: int | None, commit_index: int | None,
         in_sync: bool) -> dict:
    return {"node": node, "raft_state": state, "log_index": log_index,
            "commit_index": commit_index, "in_sync": in_sync}


async def _leader_indexes(management, meta) -> list[int] | None:
    """The leader's shard's row tail (epoch, commit index, members' indexes), or
    None when it does not answer or no longer leads."""
    reply = await management.sampler.ask(management.gateway.shards[meta.shard], [meta.qid])
    if reply is None or not reply.queues:
        return None
    return management.sampler.figure(reply.queues[0]).get("replication")
