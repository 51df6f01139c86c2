"""What each `warren ctl` command does over the management API (ctl.py reads the
command line): rabbitmqadmin's verbs (list, show, declare, delete, close, purge,
publish, get, export, import) and rabbitmqctl's (add-user, set-permissions,
set-vhost-limits...), each a function of (client, args, vhost) that makes its
calls and says what it changed."""

from __future__ import annotations

import base64
import json
import sys

from .ctlclient import Client, CtlError, render, segment

# what `list` shows, its default columns, and whether the API lists it per vhost
LISTS = {
    "queues": (["vhost", "name", "type", "durable", "messages_ready",
                "messages_unacknowledged", "consumers", "policy"], True),
    "exchanges": (["vhost", "name", "type", "durable", "auto_delete", "internal"], True),
    "bindings": (["vhost", "source", "destination", "destination_type", "routing_key",
                  "properties_key"], True),
    "connections": (["name", "user", "vhost", "channels", "state"], False),
    "channels": (["name", "user", "vhost", "consumer_count", "messages_unacknowledged",
                  "prefetch_count", "confirm"], False),
    "consumers": (["queue", "consumer_tag", "channel", "ack_required", "prefetch_count",
                   "activity_status", "consumer_timeout"], True),
    "users": (["name", "tags"], False),
    "vhosts": (["name", "description", "limits"], False),
    "permissions": (["user", "vhost", "configure", "write", "read"], False),
    "policies": (["vhost", "name", "pattern", "apply-to", "priority", "definition"], True),
    "nodes": (["name", "type", "running", "mem_used", "mem_limit", "disk_free", "disk_free_limit"],
              False),
    "vhost_limits": (["vhost", "value"], True),
    "user_limits": (["user", "value"], False),
}
OVERVIEW = ["product_name", "product_version", "cluster_name", "queue_totals.messages",
            "object_totals.queues", "object_totals.connections", "object_totals.consumers"]
# lists the API has for all vhosts only: --vhost filters them by this field
VHOST_FIELD = {"connections": "vhost", "channels": "vhost", "permissions": "vhost",
               "vhosts": "name"}
EX_USAGE, EX_UNAVAILABLE = 64, 69  # rabbitmq-queues' exit codes: bad arguments, refused
MEMBER_CHANGES = ["vhost", "name", "size", "result"]
QUORUM_STATUS = ["node", "raft_state", "log_index", "commit_index", "in_sync"]
GOT = ["routing_key", "exchange", "message_count", "payload", "payload_bytes",
       "payload_encoding", "properties", "redelivered"]  # rabbitmqadmin's columns


def run(client: Client, args) -> str | None:
    """Carry out a command; what it changed, to tell the operator."""
    handler = globals()[f"_{args.command}_{args.kind}" if hasattr(args, "kind")
                        else f"_{args.command.replace('-', '_')}"]
    return handler(client, args, args.vhost or "/")


def _list(client: Client, args, vhost: str) -> None:
    what = args.what
    default, per_vhost = LISTS[what]
    path = what.replace("_", "-")
    if args.vhost is not None and per_vhost:
        path += "/" + segment(args.vhost)
    try:
        rows = client.call("GET", path, what=f"list {what}")
    except CtlError as error:
        if args.vhost is not None and per_vhost and error.status == 404:
            raise CtlError(f"list {what}: no vhost '{args.vhost}' [404 Object Not Found]",
                           error.answer) from None
        raise
    if args.vhost is not None and what in VHOST_FIELD:
        rows = [row for row in rows if row.get(VHOST_FIELD[what]) == args.vhost]
    columns = [c for c in (args.columns or "").split(",") if c] + args.column
    print(render(rows, columns or default, args.format, whole_rows=not columns))


def _show(client: Client, args, vhost: str) -> None:
    overview = client.call("GET", "overview", what="show overview")
    columns = [c for c in (args.columns or "").split(",") if c] + args.column
    if args.format == "json" and not columns:
        print(json.dumps(overview, indent=2))
        return
    print(render([overview], columns or OVERVIEW, args.format, whole_rows=False))


def _quorum_status(client: Client, args, vhost: str) -> None:
    rows = client.call("GET", f"quorum-status/{segment(vhost)}/{segment(args.name)}",
                       what=f"quorum status of queue '{args.name}' in vhost '{vhost}'")
    if args.format != "json":
        rows = [{**row, "in_sync": "yes" if row["in_sync"] else "no"} for row in rows]
    print(render(rows, QUORUM_STATUS, args.format, whole_rows=True))


def _add_member(client: Client, args, vhost: str) -> None:
    print(f"Adding a replica for queue {args.name} on node {args.node}...")
    _member(client, "POST", args, vhost)


def _delete_member(client: Client, args, vhost: str) -> None:
    print(f"Removing a replica of queue {args.name} on node {args.node}...")
    _member(client, "DELETE", args, vhost)


def _grow(client: Client, args, vhost: str) -> None:
    if args.strategy not in ("all", "even"):
        print(f'Error (argument validation): "strategy \'{args.strategy}\' is not recognised."',
              file=sys.stderr)
        raise SystemExit(EX_USAGE)
    if args.format != "json":
        print(f"Growing {args.strategy} quorum queues on {args.node}...")
    rows = client.call("POST", f"quorum-grow/{segment(args.node)}",
                       {"strategy": args.strategy, "vhost_pattern": args.vhost_pattern,
                        "queue_pattern": args.queue_pattern}, what="grow")
    print(render(rows, MEMBER_CHANGES, args.format, whole_rows=True))


def _shrink(client: Client, args, vhost: str) -> None:
    if args.format != "json":
        print(f"Shrinking quorum queues on {args.node}...")
    rows = client.call("POST", f"quorum-shrink/{segment(args.node)}",
                       {"errors_only": args.errors_only}, what="shrink")
    print(render(rows, MEMBER_CHANGES, args.format, whole_rows=True))


def _member(client: Client, method: str, args, vhost: str) -> None:
    """A member change, failing as rabbitmq-queues does: `Error: reason`, exit 69."""
    sys.stdout.flush()
    try:
        client.call(method, f"quorum-members/{segment(vhost)}/{segment(args.name)}/"
                            f"{segment(args.node)}", what=f"{method} member")
    except CtlError as error:
        if error.status == 404:
            reason = "not_found"
        elif error.status == 400:
            reason = error.answer.get("reason", "")
        else:
            raise
        print(f"Error: {reason}", file=sys.stderr)
        raise SystemExit(EX_UNAVAILABLE) from None


def _change(client: Client, method: str, path: str, what: str, done: str, body=None,
            **request) -> str:
    """Make one change; the sentence that confirms it ("queue 'q' in vhost '/' declared")."""
    client.call(method, path, body, what=what, **request)
    return f"{what} {done}"


def _queue(args, vhost: str) -> tuple[str, str]:
    return (f"queues/{segment(vhost)}/{segment(args.name)}",
            f"queue '{args.name}' in vhost '{vhost}'")


def _declare_queue(client: Client, args, vhost: str) -> str:
    arguments = dict(args.arguments)
    if args.queue_type:
        arguments["x-queue-type"] = args.queue_type
    return _change(client, "PUT", *_queue(args, vhost), "declared",
                   {"durable": args.durable, "auto_delete": args.auto_delete,
                    "arguments": arguments})


def _delete_queue(client: Client, args, vhost: str) -> str:
    conditions = {f"if-{c}": "true" for c in ("unused", "empty") if getattr(args, f"if_{c}", 0)}
    return _change(client, "DELETE", *_queue(args, vhost), "deleted", params=conditions)


def _purge_queue(client: Client, args, vhost: str) -> str:
    path, what = _queue(args, vhost)
    return _change(client, "DELETE", f"{path}/contents", what, "purged")


def _exchange(args, vhost: str) -> tuple[str, str]:
    return (f"exchanges/{segment(vhost)}/{segment(args.name)}",
            f"exchange '{args.name}' in vhost '{vhost}'")


def _declare_exchange(client: Client, args, vhost: str) -> str:
    return _change(client, "PUT", *_exchange(args, vhost), "declared",
                   {"type": args.type, "durable": args.durable, "auto_delete": args.auto_delete,
                    "internal": args.internal, "arguments": args.arguments})


def _delete_exchange(client: Client, args, vhost: str) -> str:
    return _change(client, "DELETE", *_exchange(args, vhost), "deleted")


def _binding(args, vhost: str) -> tuple[str, str]:
    return (f"bindings/{segment(vhost)}/e/{segment(args.source)}/"
            f"{args.destination_type[0]}/{segment(args.destination)}",
            f"binding from exchange '{args.source}' to {args.destination_type} "
            f"'{args.destination}' in vhost '{vhost}'")


def _declare_binding(client: Client, args, vhost: str) -> str:
    return _change(client, "POST", *_binding(args, vhost), "declared",
                   {"routing_key": args.routing_key, "arguments": args.arguments})


def _delete_binding(client: Client, args, vhost: str) -> str:
    path, what = _binding(args, vhost)
    key = args.properties_key
    if key is None:  # find it by routing key and arguments
        rows = client.call("GET", f"bindings/{segment(vhost)}",
                           what=f"bindings of vhost '{vhost}'")
        key = next((row["properties_key"] for row in rows
                    if (row["source"], row["destination"], row["destination_type"],
                        row["routing_key"], row["arguments"]) ==
                    (args.source, args.destination, args.destination_type, args.routing_key,
                     args.arguments)), None)
        if key is None:
            raise CtlError(f"{what}: no such binding with routing key "
                           f"'{args.routing_key}' and arguments {json.dumps(args.arguments)}")
    return _change(client, "DELETE", f"{path}/{segment(key)}", what, "deleted")


def _close_connection(client: Client, args, vhost: str) -> str:
    return _change(client, "DELETE", f"connections/{segment(args.name)}",
                   f"connection '{args.name}'", "closed",
                   headers={"X-Reason": args.reason.encode()} if args.reason else None)


def _publish(client: Client, args, vhost: str) -> str:
    body = {"routing_key": args.routing_key, "properties": args.properties,
            "payload": args.payload, "payload_encoding": args.payload_encoding}
    if args.payload is None:  # stdin's bytes, whatever they are
        body.update(payload=base64.b64encode(_stdin()).decode(), payload_encoding="base64")
    where = f"exchange '{args.exchange}' in vhost '{vhost}'"
    answer = client.call("POST", f"exchanges/{segment(vhost)}/{segment(args.exchange)}/publish",
                         body, what=f"publish to {where}")
    routed = isinstance(answer, dict) and answer.get("routed")
    # as rabbitmqadmin: not being routed is no error
    return f"message published to {where}" + ("" if routed else " but NOT routed")


def _get(client: Client, args, vhost: str) -> str | None:
    if args.payload_file is not None and args.count != 1:
        raise CtlError("--payload-file takes one message: --count must be 1")
    what = f"queue '{args.queue}' in vhost '{vhost}'"
    rows = client.call("POST", f"queues/{segment(vhost)}/{segment(args.queue)}/get",
                       {"count": args.count, "ackmode": args.ackmode,
                        "encoding": args.encoding}, what=f"get from {what}")
    rows = rows if isinstance(rows, list) else []
    columns = GOT
    if args.payload_file is not None and rows:
        _write_payload(args.payload_file, rows[0])
        columns = [c for c in GOT if c not in ("payload", "payload_encoding", "properties")]
    if not rows and args.format != "json":
        return f"{what} has no messages ready"
    print(render(rows, columns, args.format, whole_rows=True))
    return None


def _stdin() -> bytes:
    if sys.stdin is None:  # started with it closed (`<&-`)
        raise CtlError("cannot read stdin: it is closed")
    try:
        return sys.stdin.buffer.read()
    except OSError as error:
        raise CtlError(f"cannot read stdin: {error.strerror}") from None


def _write_payload(path: str, message: dict) -> None:
    payload = str(message.get("payload", ""))
    try:
        data = (base64.b64decode(payload) if message.get("payload_encoding") == "base64"
                else payload.encode())
        with open(path, "wb") as f:
            f.write(data)
    except OSError as error:
        raise CtlError(f"{path}: cannot write: {error.strerror}") from None
    except ValueError:
        raise CtlError(f"the message's payload is not base64: {payload[:40]!r}") from None


def _add_user(client: Client, args, vhost: str) -> str:
    tags = [t for t in args.tags.split(",") if t]
    secret = getattr(args, "password_hash", None)
    if (args.new_password is None) == (secret is None):
        raise CtlError("declare user: give a password or a password_hash (one of them)")
    return _change(client, "PUT", f"users/{segment(args.name)}", f"user '{args.name}'",
                   "added" + (f" with tags {','.join(tags)}" if tags else ""),
                   {"tags": tags, **({"password": args.new_password} if secret is None
                                     else {"password_hash": secret})})


def _change_password(client: Client, args, vhost: str) -> str:
    path, what = f"users/{segment(args.name)}", f"user '{args.name}'"
    user = client.call("GET", path, what=what)  # to keep its tags
    return _change(client, "PUT", path, f"password of {what}", "changed",
                   {"password": args.new_password, "tags": user["tags"]})


def _set_user_tags(client: Client, args, vhost: str) -> str:
    path, what = f"users/{segment(args.name)}", f"user '{args.name}'"
    user = client.call("GET", path, what=what)
    # its password hash goes back with the tags: a PUT without one clears the password
    # in RabbitMQ
    tags = [tag for word in args.tags for tag in word.split(",") if tag]
    return _change(client, "PUT", path, f"tags of {what}", "set to " + (
        ",".join(tags) or "none"), {"password_hash": (user or {}).get("password_hash", ""),
                                     "tags": tags})


def _delete_user(client: Client, args, vhost: str) -> str:
    return _change(client, "DELETE", f"users/{segment(args.name)}", f"user '{args.name}'",
                   "deleted")


def _add_vhost(client: Client, args, vhost: str) -> str:
    return _change(client, "PUT", f"vhosts/{segment(args.name)}", f"vhost '{args.name}'",
                   "added", {})


def _delete_vhost(client: Client, args, vhost: str) -> str:
    return _change(client, "DELETE", f"vhosts/{segment(args.name)}", f"vhost '{args.name}'",
                   "deleted")


def _permissions(args, vhost: str) -> tuple[str, str]:
    return (f"permissions/{segment(vhost)}/{segment(args.perm_user)}",
            f"permissions of user '{args.perm_user}' in vhost '{vhost}'")


def _set_permissions(client: Client, args, vhost: str) -> str:
    return _change(client, "PUT", *_permissions(args, vhost), "set",
                   {"configure": args.configure, "write": args.write, "read": args.read})


def _clear_permissions(client: Client, args, vhost: str) -> str:
    return _change(client, "DELETE", *_permissions(args, vhost), "cleared")


def _policy(args, vhost: str) -> tuple[str, str]:
    return (f"policies/{segment(vhost)}/{segment(args.name)}",
            f"policy '{args.name}' in vhost '{vhost}'")


def _set_policy(client: Client, args, vhost: str) -> str:
    return _change(client, "PUT", *_policy(args, vhost), "set",
                   {"pattern": args.pattern, "definition": args.definition,
                    "apply-to": args.apply_to, "priority": args.priority})


def _clear_policy(client: Client, args, vhost: str) -> str:
    return _change(client, "DELETE", *_policy(args, vhost), "cleared")


def _set_limits(client: Client, base: str, what: str, limits: dict) -> str:
    """Set each limit (PUT {base}/{name}); the sentence saying so."""
    for name, value in limits.items():
        client.call("PUT", f"{base}/{segment(name)}", {"value": value}, what=f"{what} {name}")
    return f"{what} set: " + ", ".join(f"{name}={value}" for name, value in limits.items())


def _clear_limits(client: Client, base: str, what: str, names: list[str]) -> str:
    """Remove the limits named, or all there are; the sentence saying so."""
    if not names:
        rows = client.call("GET", base, what=what)
        names = sorted(rows[0]["value"]) if rows else []
    for name in names:
        client.call("DELETE", f"{base}/{segment(name)}", what=f"{what} {name}")
    return f"{what} cleared: " + (", ".join(names) or "none were set")


def _of_vhost(vhost: str) -> tuple[str, str]:
    return f"vhost-limits/{segment(vhost)}", f"limits of vhost '{vhost}'"


def _of_user(args) -> tuple[str, str]:
    return f"user-limits/{segment(args.name)}", f"limits of user '{args.name}'"


def _set_vhost_limits(client: Client, args, vhost: str) -> str:
    return _set_limits(client, *_of_vhost(vhost), args.limits)


def _clear_vhost_limits(client: Client, args, vhost: str) -> str:
    return _clear_limits(client, *_of_vhost(vhost), args.names)


def _declare_vhost_limit(client: Client, args, vhost: str) -> str:
    return _set_limits(client, *_of_vhost(vhost), {args.name: args.value})


def _delete_vhost_limit(client: Client, args, vhost: str) -> str:
    return _clear_limits(client, *_of_vhost(vhost), [args.name])


def _set_user_limits(client: Client, args, vhost: str) -> str:
    return _set_limits(client, *_of_user(args), args.limits)


def _clear_user_limits(client: Client, args, vhost: str) -> str:
    return _clear_limits(client, *_of_user(args), args.names)


# rabbitmqadmin's names for what rabbitmqctl's do
_declare_vhost = _add_vhost
_declare_user = _add_user
_declare_permission = _set_permissions
_delete_permission = _clear_permissions
_declare_policy = _set_policy
_delete_policy = _clear_policy


# what a per-vhost export holds, as RabbitMQ's GET /api/definitions/{vhost}: the
# objects of one vhost, its queues, exchanges and bindings without their vhost field
VHOST_SECTIONS = ("parameters", "policies", "queues", "exchanges", "bindings")
UNPLACED = ("queues", "exchanges", "bindings")


def _export(client: Client, args, vhost: str) -> str | None:
    document = client.call("GET", "definitions", what="export")
    if args.vhost is not None:
        if not any(v.get("name") == args.vhost for v in document.get("vhosts", [])):
            raise CtlError(f"export: no vhost '{args.vhost}' [404 Object Not Found]")
        document = {"rabbit_version": document.get("rabbit_version"), **{
            section: [{k: v for k, v in item.items() if k != "vhost" or section not in UNPLACED}
                      for item in document.get(section, []) if item.get("vhost") == args.vhost]
            for section in VHOST_SECTIONS}}
    data = json.dumps(document, indent=2)
    if args.file == "-":
        print(data)
        return None
    try:
        with open(args.file, "w") as f:
            f.write(data + "\n")
    except OSError as error:
        raise CtlError(f"{args.file}: cannot write: {error.strerror}") from None
    return f"definitions exported to {args.file}"


def _import(client: Client, args, vhost: str) -> str:
    if args.file == "-":
        data = _stdin()
    else:
        try:
            with open(args.file, "rb") as f:
                data = f.read()
        except OSError as error:
            raise CtlError(f"{args.file}: cannot read: {error.strerror}") from None
    params = {"skip-unsupported": "true"} if args.skip_unsupported else None
    if args.vhost is not None:
        data = _into_vhost(data, args.vhost, args.file)
    try:  # the file as it is: the API judges it (Python's JSON would recurse on nesting)
        answer = client.call("POST", "definitions", raw=data, params=params,
                             what=f"import of {args.file}")
    except CtlError as error:
        unsupported = error.answer.get("unsupported")
        if unsupported and error.answer.get("problems") == unsupported:  # nothing else wrong
            raise CtlError(f"{error}\n--skip-unsupported imports the rest and lists what it "
                           "skips") from None
        raise
    skipped = answer.get("skipped", []) if isinstance(answer, dict) else []
    if args.vhost is not None:
        message = f"definitions imported from {args.file} into vhost '{args.vhost}'"
    else:
        message = f"definitions imported from {args.file}"
    if skipped:
        message += f"; skipped, as Warren does not support them ({len(skipped)}):"
        message += "".join(f"\n  {item}" for item in skipped)
    return message


def _into_vhost(data: bytes, vhost: str, name: str) -> bytes:
    """A per-vhost export (RabbitMQ's, of GET /api/definitions/{vhost}) as the whole
    broker's: its objects, each in `vhost`, which must exist."""
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        raise CtlError(f"import of {name}: not JSON, or nested too deeply to read") from None
    if not isinstance(document, dict):
        raise CtlError(f"import of {name}: expected a JSON object of definitions")
    placed = {section: [{**item, "vhost": vhost} if isinstance(item, dict) else item
                        for item in document.get(section) or []]
              for section in VHOST_SECTIONS}
    try:
        return json.dumps({**document, **placed}).encode()
    except RecursionError:
        raise CtlError(f"import of {name}: nested too deeply to read") from None
