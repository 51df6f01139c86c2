"""`warren ctl`: the management API from the command line, as rabbitmqadmin and
rabbitmqctl are used with RabbitMQ: rabbitmqadmin's verbs (list, show, declare,
delete, close, purge, publish, get, export, import; `name=value` arguments work
too) and rabbitmqctl's (add-user, set-user-tags, set-permissions,
set-vhost-limits...). A change prints what it did; an error prints the API's
reason and exits 1; a command it cannot read, its usage, exiting 2. This module
reads the command line; ctlcommands.py carries the commands out."""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys

from .. import config
from . import ctlclient
from .ctlclient import Client, CtlError
from .ctlcommands import LISTS, run

GLOBAL_DEFAULTS = {"url": None, "user": None, "password": None, "config": None,
                   "vhost": None, "format": "table", "quiet": False}


def _boolean(text: str) -> bool:
    try:
        return config.parse_boolean(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}") from None


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not JSON: {text}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text}")
    return value


def _global_options() -> argparse.ArgumentParser:
    """The options every command takes, before or after its name (as rabbitmqctl's).
    Their defaults are SUPPRESS so that a command's parser, which sees them again,
    leaves a value given before the command as it is; main() supplies the defaults."""
    options = argparse.ArgumentParser(add_help=False)
    group = options.add_argument_group("target and output (before or after the command)")
    add = functools.partial(group.add_argument, default=argparse.SUPPRESS)
    add("--url", help=f"management API, e.g. http://host:15672 (default: ${ctlclient.URL_VARIABLE}, "
                      "else the configuration file's management_bind and management_port, "
                      "else http://127.0.0.1:15672)")
    add("-u", "--user", help=f"user (default: ${ctlclient.USER_VARIABLE}, else the configuration "
                             "file's default_user, else guest)")
    add("-p", "--password", help=f"password (default: ${ctlclient.PASSWORD_VARIABLE}, else the "
                                 "configuration file's default_pass, else guest)")
    add("-c", "--config", metavar="FILE",
        help=f"the broker's warren.toml to find the API in (default: ${ctlclient.CONFIG_VARIABLE}, "
             "else ./warren.toml when present)")
    add("-V", "--vhost", help="vhost: what list shows (default: all) and what changes "
                              "apply to (default: /)")
    add("-f", "--format", choices=ctlclient.FORMATS, help="output format (default: table)")
    add("--json", dest="format", action="store_const", const="json",
        help="the same as --format json")
    add("-q", "--quiet", action="store_true", help="say nothing when a change succeeds")
    return options


def _parser() -> argparse.ArgumentParser:
    options = _global_options()
    parser = argparse.ArgumentParser(
        prog="warren ctl", parents=[options],
        description="Manage a Warren broker over its management HTTP API, as rabbitmqadmin "
                    "and rabbitmqctl manage RabbitMQ.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    command = functools.partial(_command, commands, options)

    listing = command("list", "list objects as a table, TSV or JSON")
    listing.add_argument("what", choices=sorted(LISTS), type=lambda s: s.replace("-", "_"),
                         help="what to list")
    _columns(listing)
    show = command("show", "show the broker's overview (all of it with --format json)")
    show.add_argument("what", choices=["overview"], help="what to show")
    _columns(show)

    _objects(command("declare", "create a queue, exchange or binding (rabbitmqadmin's "
                                "declare; name=value arguments work too)"), options, DECLARE)
    _objects(command("delete", "delete a queue, exchange or binding"), options, DELETE)
    _objects(command("close", "close a client connection"), options, CLOSE)
    _objects(command("purge", "remove a queue's ready messages"), options, PURGE)
    _fields(command("publish", "publish a message to an exchange in --vhost (rabbitmqadmin's "
                               "publish; the payload is read from stdin when not given)"),
            PUBLISH)
    _fields(command("get", "get messages from a queue in --vhost (rabbitmqadmin's get; they "
                           "are requeued unless --ackmode says otherwise)"), GET)

    add_user = command("add-user", "create a user (or set an existing one's password and tags)")
    add_user.add_argument("name", help="user name")
    add_user.add_argument("new_password", metavar="password", help="password")
    add_user.add_argument("--tags", default="", help="comma-separated tags, e.g. administrator")
    change = command("change-password", "set a user's password (its tags stay)")
    change.add_argument("name", help="user name")
    change.add_argument("new_password", metavar="password", help="new password")
    tags = command("set-user-tags", "set a user's tags (none: no tags); its password stays")
    tags.add_argument("name", help="user name")
    tags.add_argument("tags", nargs="*", metavar="tag", help="a tag, e.g. administrator")
    command("delete-user", "delete a user").add_argument("name", help="user name")
    command("add-vhost", "create a vhost").add_argument("name", help="vhost name")
    command("delete-vhost", "delete a vhost and everything in it").add_argument(
        "name", help="vhost name")
    perms = command("set-permissions", "set a user's permissions in --vhost")
    perms.add_argument("perm_user", metavar="user", help="user name")
    for name in ("configure", "write", "read"):
        perms.add_argument(name, help=f"regular expression of the resources it may {name}")
    command("clear-permissions", "remove a user's permissions in --vhost").add_argument(
        "perm_user", metavar="user", help="user name")
    policy = command("set-policy", "set a policy in --vhost")
    policy.add_argument("name", help="policy name")
    policy.add_argument("pattern", help="regular expression of the queue/exchange names")
    policy.add_argument("definition", type=_json_object,
                        help="JSON object, e.g. '{\"max-length\": 100}'")
    policy.add_argument("--apply-to", default="all", help="what it applies to",
                        choices=["queues", "classic_queues", "quorum_queues", "streams", "exchanges",
                                 "all"])
    policy.add_argument("--priority", type=int, default=0,
                        help="the highest-priority matching policy wins (default 0)")
    command("clear-policy", "remove a policy from --vhost").add_argument(
        "name", help="policy name")
    limits = command("set-vhost-limits", "set limits of --vhost (the others stay)")
    limits.add_argument("limits", type=_json_object,
                        help='JSON object, e.g. \'{"max-connections": 10, "max-queues": 50}\'')
    clear = command("clear-vhost-limits", "remove limits of --vhost")
    clear.add_argument("names", nargs="*", metavar="limit",
                       help="limits to remove, e.g. max-connections (default: all)")
    user_limits = command("set-user-limits", "set a user's limits (the others stay)")
    user_limits.add_argument("name", help="user name")
    user_limits.add_argument("limits", type=_json_object,
                             help='JSON object, e.g. \'{"max-connections": 5, '
                                  '"max-channels": 20}\'')
    clear = command("clear-user-limits", "remove a user's limits")
    clear.add_argument("name", help="user name")
    clear.add_argument("names", nargs="*", metavar="limit",
                       help="limits to remove, e.g. max-channels (default: all)")
    command("quorum_status", "the members of a quorum queue in --vhost, one row each: "
                             "its state, log and commit index, whether in sync "
                             "(rabbitmq-queues quorum_status)").add_argument(
        "name", help="queue name")
    for name, help in (("add_member", "add a member on a node to a quorum queue in --vhost "
                                      "(rabbitmq-queues add_member)"),
                       ("delete_member", "remove a quorum queue's member on a node, in "
                                         "--vhost (rabbitmq-queues delete_member)")):
        member = command(name, help)
        member.add_argument("name", help="queue name")
        member.add_argument("node", help="node name")
    grow = command("grow", "add a member on a node to every quorum queue that lacks one "
                           "there (all, or those with an even number of members)")
    grow.add_argument("node", help="node name")
    grow.add_argument("strategy", help="all or even")
    grow.add_argument("--vhost-pattern", default=".*", help="regular expression of the vhosts")
    grow.add_argument("--queue-pattern", default=".*", help="regular expression of the queues")
    shrink = command("shrink", "remove a node's member from every quorum queue")
    shrink.add_argument("node", help="node name")
    shrink.add_argument("--errors-only", action="store_true",
                        help="list only the queues it could not be removed from")
    command("purge-queue", "remove a queue's ready messages").add_argument(
        "name", help="queue name")
    command("delete-queue", "delete a queue").add_argument("name", help="queue name")
    command("export", "write the definitions (users, vhosts, permissions, policies, "
                      "durable queues, exchanges, bindings) as JSON; with --vhost, that "
                      "vhost's alone, as RabbitMQ's per-vhost export").add_argument(
        "file", help="a path, or - for stdout")
    importing = command("import", "load definitions, e.g. a RabbitMQ export (with --vhost: "
                                  "a per-vhost export, into that vhost); nothing changes if "
                                  "the file has problems")
    importing.add_argument("file", help="a path, or - for stdin")
    importing.add_argument("--skip-unsupported", action="store_true",
                           help="import what Warren supports and list what it skipped "
                                "(default: refuse a file holding anything unsupported)")
    return parser


def _columns(parser) -> None:
    parser.add_argument("column", nargs="*", help="columns to show, as rabbitmqadmin's "
                                                  "`list queues name messages`")
    parser.add_argument("--columns", help="comma-separated columns to show, e.g. "
                                          "name,messages_ready (dotted: message_stats.publish)")


def _command(commands, options, name: str, help: str) -> argparse.ArgumentParser:
    return commands.add_parser(name, parents=[options], help=help, description=help)


# rabbitmqadmin's objects and their name=value arguments: (option, help, keywords)
_NAME = ("name", "name", {"required": True})
_ARGUMENTS = ("arguments", "JSON object of x- arguments, e.g. '{\"x-max-length\": 10}'",
              {"type": _json_object, "default": {}})
_BINDING = [("source", "exchange the binding is from", {"required": True}),
            ("destination", "queue or exchange it leads to", {"required": True}),
            ("destination_type", "queue or exchange (default queue)",
             {"choices": ["queue", "exchange"], "default": "queue"})]
# user= and password= (rabbitmqadmin's) would be the global --user and --password
_PERM_USER = ("perm_user", "the user (user=... in rabbitmqadmin's form)", {"required": True})
RENAMED = {"user": "perm-user", "password": "new-password"}
DECLARE = {
    "queue": ("declare a queue in --vhost", [
        _NAME, ("durable", "survives a restart (default true)", {"type": _boolean,
                                                                  "default": True}),
        ("auto_delete", "deleted when its last consumer goes (default false)",
         {"type": _boolean, "default": False}),
        ("queue_type", "classic, quorum or stream (sets x-queue-type)", {}), _ARGUMENTS]),
    "exchange": ("declare an exchange in --vhost", [
        _NAME, ("type", "direct, fanout, topic or headers", {"required": True}),
        ("durable", "survives a restart (default true)", {"type": _boolean, "default": True}),
        ("auto_delete", "deleted when its last binding goes (default false)",
         {"type": _boolean, "default": False}),
        ("internal", "clients cannot publish to it (default false)",
         {"type": _boolean, "default": False}), _ARGUMENTS]),
    "binding": ("bind a queue or exchange to an exchange in --vhost", [
        *_BINDING, ("routing_key", "routing key (default empty)", {"default": ""}),
        _ARGUMENTS]),
    "vhost": ("create a vhost", [_NAME]),
    "user": ("create a user (or set an existing one's password and tags)", [
        _NAME, ("new_password", "password (password=... in rabbitmqadmin's form)", {}),
        ("password_hash", "instead of a password, its hash as an export holds it "
                          "(rabbit_password_hashing_sha256)", {}),
        ("tags", "comma-separated tags, e.g. administrator", {"default": ""})]),
    "permission": ("set a user's permissions in --vhost", [
        _PERM_USER, *[(access, f"regular expression of the resources it may {access}",
                       {"required": True}) for access in ("configure", "write", "read")]]),
    "policy": ("set a policy in --vhost", [
        _NAME, ("pattern", "regular expression of the queue/exchange names", {"required": True}),
        ("definition", "JSON object, e.g. '{\"max-length\": 100}'",
         {"type": _json_object, "required": True}),
        ("priority", "the highest-priority matching policy wins (default 0)",
         {"type": int, "default": 0}),
        ("apply_to", "queues, classic_queues, quorum_queues, streams, exchanges or all "
                     "(default)",
         {"default": "all"})]),
    "vhost_limit": ("set a limit of --vhost", [
        ("name", "max-connections or max-queues", {"required": True}),
        ("value", "the limit (negative: none)", {"type": int, "required": True})]),
}
DELETE = {
    "queue": ("delete a queue in --vhost", [
        _NAME, ("if_unused", "only if it has no consumers", {"type": _boolean, "default": False}),
        ("if_empty", "only if it has no messages", {"type": _boolean, "default": False})]),
    "exchange": ("delete an exchange in --vhost", [_NAME]),
    "binding": (("delete a binding in --vhost: by its properties_key (see `list bindings`), "
                 "or by its routing key and arguments"), [
                    *_BINDING, ("properties_key", "the binding's properties_key", {}),
                    ("routing_key", "routing key (default empty)", {"default": ""}),
                    _ARGUMENTS]),
    "vhost": ("delete a vhost and everything in it", [_NAME]),
    "user": ("delete a user", [_NAME]),
    "permission": ("remove a user's permissions in --vhost", [_PERM_USER]),
    "policy": ("remove a policy from --vhost", [_NAME]),
    "vhost_limit": ("remove a limit of --vhost", [
        ("name", "max-connections or max-queues", {"required": True})]),
}
CLOSE = {"connection": ("close a client connection (its clients see 320 CONNECTION_FORCED)", [
    ("name", "connection name (see `list connections`)", {"required": True}),
    ("reason", "what the client is told (default: Closed via management plugin)", {})])}
PURGE = {"queue": ("remove a queue's ready messages", [_NAME])}
PUBLISH = [("routing_key", "routing key", {"required": True}),
           ("exchange", "exchange (default: amq.default, the default exchange)",
            {"default": "amq.default"}),
           ("payload", "the message body (default: stdin's, as bytes)", {}),
           ("payload_encoding", "string (default) or base64: how --payload is written",
            {"choices": ["string", "base64"], "default": "string"}),
           ("properties", "JSON object of properties, e.g. '{\"delivery_mode\": 2, "
                          "\"headers\": {\"k\": 1}}'", {"type": _json_object, "default": {}})]
ACKMODES = ["ack_requeue_true", "ack_requeue_false", "reject_requeue_true",
            "reject_requeue_false"]
GET = [("queue", "queue name", {"required": True}),
       ("count", "how many messages at most (default 1)", {"type": int, "default": 1}),
       ("ackmode", f"what becomes of them: {', '.join(ACKMODES)} (default: requeued, "
                   "ack_requeue_true)", {"choices": ACKMODES, "default": "ack_requeue_true"}),
       ("encoding", "auto (default: text when it is UTF-8, else base64) or base64",
        {"choices": ["auto", "base64"], "default": "auto"}),
       ("payload_file", "write the message's body to this file (with --count 1) and show "
                        "the rest", {})]


def _objects(parser, options, table: dict) -> None:
    kinds = parser.add_subparsers(dest="kind", required=True, metavar="OBJECT")
    for kind, (help, fields) in table.items():
        _fields(kinds.add_parser(kind, parents=[options], help=help, description=help),
                fields)


def _fields(parser, fields: list) -> None:
    for field, field_help, keywords in fields:
        parser.add_argument(f"--{field.replace('_', '-')}", dest=field, help=field_help,
                            **keywords)


_FLAGS = {"--json", "-q", "--quiet", "-h", "--help"}  # the options that take no value


# rabbitmqadmin's verbs that take name=value words: after an object's kind, or at once
_KEYWORD_VERBS = {"declare": 2, "delete": 2, "close": 2, "purge": 2, "publish": 1, "get": 1}


def _rabbitmqadmin_style(argv: list[str]) -> list[str]:
    """`declare queue name=q durable=false` as `declare queue --name=q --durable=false`:
    after those verbs, a `key=value` word that is no option's value."""
    position = 0
    while position < len(argv) and argv[position].startswith("-"):  # global options
        takes_value = argv[position] not in _FLAGS and "=" not in argv[position]
        position += 2 if takes_value else 1
    if position >= len(argv) or argv[position] not in _KEYWORD_VERBS:
        return argv
    start = position + _KEYWORD_VERBS[argv[position]]
    rewritten = argv[:start]
    for word in argv[start:]:
        key, equals, value = word.partition("=")
        previous = rewritten[-1]
        is_value = (previous.startswith("-") and previous not in _FLAGS
                    and "=" not in previous)
        if equals and not is_value and re.fullmatch(r"[a-z][a-z_-]*", key):
            key = key.replace("_", "-")
            word = f"--{RENAMED.get(key, key)}={value}"
        rewritten.append(word)
    return rewritten


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    for word in argv:
        try:
            word.encode()
        except UnicodeEncodeError:  # bytes that are not UTF-8 (surrogate-escaped)
            parser.error(f"not UTF-8 text: {ascii(word)}")
    args, extra = parser.parse_known_args(_rabbitmqadmin_style(argv),
                                          argparse.Namespace(**GLOBAL_DEFAULTS))
    # argparse gives `list queues -V v name messages` the columns after an option as
    # extra words: they are columns still
    if extra and args.command in ("list", "show") and not any(
            word.startswith("-") for word in extra):
        args.column += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        client = Client(*ctlclient.target(args.url, args.user, args.password, args.config))
        message = run(client, args)
        if message and not args.quiet:
            print(json.dumps({"ok": True, "message": message}) if args.format == "json"
                  else message)
        sys.stdout.flush()
    except CtlError as error:
        print(f"warren ctl: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130  # as a shell counts a SIGINT
    except BrokenPipeError:  # the reader left (`| head`): stop quietly, as cat does
        _discard_stdout()
        return 1
    return 0


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so that Python's flush at exit does not fail again."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
    except (OSError, ValueError):  # a stdout with no descriptor (in tests)
        pass


if __name__ == "__main__":
    sys.exit(main())
