"""`warren ctl`: the management API from the command line (tables by default,
--json for scripts), as rabbitmqctl/rabbitmqadmin are used with RabbitMQ."""

from __future__ import annotations

import argparse
import base64
import functools
import json
import sys
import urllib.error
import urllib.request
from urllib.parse import quote

COLUMNS = {
    "queues": ["vhost", "name", "type", "durable", "messages_ready",
               "messages_unacknowledged", "consumers", "policy"],
    "exchanges": ["vhost", "name", "type", "durable", "auto_delete", "internal"],
    "bindings": ["vhost", "source", "destination", "destination_type", "routing_key"],
    "connections": ["name", "user", "vhost", "channels", "state"],
    "channels": ["name", "user", "vhost", "consumer_count", "messages_unacknowledged",
                 "prefetch_count", "confirm"],
    "consumers": ["queue", "consumer_tag", "channel", "ack_required", "prefetch_count",
                  "activity_status", "consumer_timeout"],
    "users": ["name", "tags"],
    "vhosts": ["name", "description"],
    "permissions": ["user", "vhost", "configure", "write", "read"],
    "policies": ["vhost", "name", "pattern", "apply-to", "priority", "definition"],
}


class CtlError(Exception):
    pass


class Client:
    def __init__(self, url: str, user: str, password: str):
        self.url = url.rstrip("/")
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def call(self, method: str, path: str, body=None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + "/api/" + path, data=data, method=method,
                                         headers={"Authorization": self.auth,
                                                  "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                raw = response.read()
        except urllib.error.HTTPError as error:
            try:
                body = json.loads(error.read())
            except ValueError:
                body = {}
            problems = "".join(f"\n  {problem}" for problem in body.get("problems", []))
            raise CtlError(f"{method} {path}: {error.code} {body.get('reason', error.reason)}"
                           f"{problems}") from None
        except urllib.error.URLError as error:
            raise CtlError(f"cannot reach {self.url}: {error.reason}") from None
        return json.loads(raw) if raw else None


def _v(vhost: str) -> str:
    return quote(vhost, safe="")


def _cell(row: dict, column: str) -> str:
    value = row.get(column)
    if column == "queue" and isinstance(value, dict):
        value = value.get("name")
    if column == "channel" and "channel_details" in row:
        value = row["channel_details"].get("name")
    if isinstance(value, (dict, list)):
        value = json.dumps(value) if isinstance(value, dict) else ",".join(map(str, value))
    return "" if value is None else str(value)


def table(rows: list[dict], columns: list[str]) -> str:
    cells = [[_cell(row, c) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


GLOBAL_DEFAULTS = {"url": "http://127.0.0.1:15672", "user": "guest", "password": "guest",
                   "vhost": "/", "json": False}


def _global_options() -> argparse.ArgumentParser:
    """The options every command takes, before or after its name (as rabbitmqctl's).
    Their defaults are SUPPRESS so that a command's parser, which sees them again,
    leaves a value given before the command as it is; main() supplies the defaults."""
    options = argparse.ArgumentParser(add_help=False)
    for name in ("url", "user", "password", "vhost"):
        options.add_argument(f"--{name}", default=argparse.SUPPRESS,
                             help=f"default: {GLOBAL_DEFAULTS[name]}")
    options.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                         help="JSON output, for scripts")
    return options


def main(argv: list[str] | None = None) -> int:
    options = _global_options()
    parser = argparse.ArgumentParser(prog="warren ctl", parents=[options],
                                     description="manage a Warren broker over its HTTP API")
    commands = parser.add_subparsers(dest="command", required=True)
    add_parser = functools.partial(commands.add_parser, parents=[options])
    listing = add_parser("list", help="list objects")
    listing.add_argument("what", choices=sorted(COLUMNS))
    add_user = add_parser("add-user")
    add_user.add_argument("name")
    add_user.add_argument("new_password", metavar="password")
    add_user.add_argument("--tags", default="")
    add_parser("delete-user").add_argument("name")
    add_parser("add-vhost").add_argument("name")
    add_parser("delete-vhost").add_argument("name")
    perms = add_parser("set-permissions")
    for name in ("perm_user", "configure", "write", "read"):
        perms.add_argument(name, metavar=name.replace("perm_", ""))
    add_parser("clear-permissions").add_argument("perm_user", metavar="user")
    policy = add_parser("set-policy")
    policy.add_argument("name")
    policy.add_argument("pattern")
    policy.add_argument("definition", help="JSON object, e.g. '{\"max-length\": 100}'")
    policy.add_argument("--apply-to", default="all",
                        choices=["queues", "classic_queues", "quorum_queues", "exchanges", "all"])
    policy.add_argument("--priority", type=int, default=0)
    add_parser("clear-policy").add_argument("name")
    add_parser("purge-queue").add_argument("name")
    add_parser("delete-queue").add_argument("name")
    add_parser("export").add_argument("file", help="a path, or - for stdout")
    add_parser("import").add_argument("file", help="a path, or - for stdin")
    args = parser.parse_args(argv, argparse.Namespace(**GLOBAL_DEFAULTS))
    client = Client(args.url, args.user, args.password)
    try:
        return run(client, args)
    except CtlError as error:
        print(f"warren ctl: {error}", file=sys.stderr)
        return 1


def run(client: Client, args) -> int:
    vhost = _v(args.vhost)
    command = args.command
    if command == "list":
        rows = client.call("GET", args.what)
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            print(table(rows, COLUMNS[args.what]))
        return 0
    if command == "add-user":
        tags = [t for t in args.tags.split(",") if t]
        client.call("PUT", f"users/{quote(args.name, safe='')}",
                    {"password": args.new_password, "tags": tags})
    elif command == "delete-user":
        client.call("DELETE", f"users/{quote(args.name, safe='')}")
    elif command == "add-vhost":
        client.call("PUT", f"vhosts/{_v(args.name)}", {})
    elif command == "delete-vhost":
        client.call("DELETE", f"vhosts/{_v(args.name)}")
    elif command == "set-permissions":
        client.call("PUT", f"permissions/{vhost}/{quote(args.perm_user, safe='')}",
                    {"configure": args.configure, "write": args.write, "read": args.read})
    elif command == "clear-permissions":
        client.call("DELETE", f"permissions/{vhost}/{quote(args.perm_user, safe='')}")
    elif command == "set-policy":
        try:
            definition = json.loads(args.definition)
        except ValueError:
            raise CtlError(f"the definition is not JSON: {args.definition}") from None
        client.call("PUT", f"policies/{vhost}/{quote(args.name, safe='')}",
                    {"pattern": args.pattern, "definition": definition,
                     "apply-to": args.apply_to, "priority": args.priority})
    elif command == "clear-policy":
        client.call("DELETE", f"policies/{vhost}/{quote(args.name, safe='')}")
    elif command == "purge-queue":
        client.call("DELETE", f"queues/{vhost}/{quote(args.name, safe='')}/contents")
    elif command == "delete-queue":
        client.call("DELETE", f"queues/{vhost}/{quote(args.name, safe='')}")
    elif command == "export":
        data = json.dumps(client.call("GET", "definitions"), indent=2)
        if args.file == "-":
            print(data)
        else:
            with open(args.file, "w") as f:
                f.write(data + "\n")
    elif command == "import":
        text = sys.stdin.read() if args.file == "-" else open(args.file).read()
        try:
            client.call("POST", "definitions", json.loads(text))
        except ValueError:
            raise CtlError(f"{args.file} is not JSON") from None
    if args.json:
        print(json.dumps({"ok": True}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
