"""What `warren ctl` talks to and how it shows answers: the target (option, else
environment, else the broker's configuration file, as rabbitmqadmin reads
~/.rabbitmqadmin.conf), the HTTP client, and tables, TSV and JSON."""

from __future__ import annotations

import json
import os
import re
from urllib.parse import quote

import requests
import tabulate

from .. import config

URL_VARIABLE = "WARREN_MANAGEMENT_URL"
USER_VARIABLE = "WARREN_MANAGEMENT_USER"
PASSWORD_VARIABLE = "WARREN_MANAGEMENT_PASSWORD"
CONFIG_VARIABLE = "WARREN_CONFIG"
DEFAULT_CONFIG = "warren.toml"  # read when present in the working directory
DEFAULTS = {"url": "http://127.0.0.1:15672", "user": "guest", "password": "guest"}
FORMATS = ("table", "tsv", "json")


class CtlError(Exception):
    def __init__(self, message: str, answer: dict | None = None, status: int = 0):
        super().__init__(message)
        self.answer = answer or {}  # the API's error body, when it gave one
        self.status = status  # its HTTP status, when it answered


def target(url: str | None, user: str | None, password: str | None,
           config_path: str | None) -> tuple[str, str, str]:
    """The URL, user and password: each from its option, else its environment
    variable, else the broker's configuration file, else RabbitMQ's default."""
    chosen = {name: given or os.environ.get(variable)
              for name, given, variable in (("url", url, URL_VARIABLE),
                                            ("user", user, USER_VARIABLE),
                                            ("password", password, PASSWORD_VARIABLE))}
    # the file only when needed: a broken one must not stop `--url ... -u ... -p ...`
    from_file = _from_config(config_path) if None in chosen.values() else {}
    return tuple(chosen[name] or from_file.get(name) or DEFAULTS[name]
                 for name in ("url", "user", "password"))


def _from_config(path: str | None) -> dict:
    """The management listener and the default user of a warren.toml: the file
    named, or $WARREN_CONFIG, or ./warren.toml if there is one."""
    path = path or os.environ.get(CONFIG_VARIABLE)
    if path is None:
        if not os.path.isfile(DEFAULT_CONFIG):
            return {}
        path = DEFAULT_CONFIG
    try:
        values = config.load_file(path)
    except config.ConfigError as error:
        raise CtlError(str(error)) from None
    except ValueError:  # tomllib reads the file as UTF-8 and lets the decoding error out
        raise CtlError(f"{path}: not valid TOML: not UTF-8 text") from None
    defaults = config.Config()

    def value(key: str, kind: type):
        got = values.get(key, getattr(defaults, key))
        if type(got) is not kind:  # type(): a boolean is no port
            raise CtlError(f"{path}: {key}: expected {kind.__name__}, got {got!r}")
        return got

    found = {"user": value("default_user", str), "password": value("default_pass", str)}
    port = value("management_port", int)
    if not 0 <= port <= 65535:
        raise CtlError(f"{path}: management_port: must be a port number, 0-65535 "
                       f"(got {port})")
    if port:  # 0: the broker has no management listener
        host = value("management_bind", str)
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
        if not re.fullmatch(r"[\w.:%-]+", host, re.ASCII):
            raise CtlError(f"{path}: management_bind: not an address or host name: {host!r}")
        found["url"] = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    return found


def segment(name: str) -> str:
    """A name as one path segment of the API ('/' as %2F)."""
    if not name:  # the path would end at the collection: no object is named ""
        raise CtlError("a name cannot be empty")
    return quote(name, safe="")


class Client:
    def __init__(self, url: str, user: str, password: str, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.session = requests.Session()
        # as UTF-8, as RabbitMQ reads them (requests would send Latin-1, or fail)
        self.session.auth = (user.encode(), password.encode())
        self.timeout = timeout

    def call(self, method: str, path: str, body=None, what: str | None = None,
             params: dict | None = None, headers: dict | None = None,
             raw: bytes | None = None):
        """The API's answer to one request (parsed JSON, or None when empty). The
        body is `body` as JSON, or `raw`, JSON as it is, for the API to judge. An
        error is a CtlError with the API's reason and `what` was asked for."""
        if raw is not None:
            headers = {**(headers or {}), "Content-Type": "application/json"}
        try:
            response = self.session.request(method, f"{self.url}/api/{path}", json=body,
                                            data=raw, params=params, headers=headers,
                                            timeout=self.timeout)
        except requests.RequestException as error:
            raise CtlError(f"cannot reach {self.url}: {_cause(error)}") from None
        if response.status_code >= 400:
            raise CtlError(*_explain(response, what or f"{method} /api/{path}"),
                           response.status_code)
        if not response.content:
            return None
        try:
            return response.json()
        except (ValueError, RecursionError):
            raise CtlError(f"{self.url} answered {method} /api/{path} with something other "
                           f"than JSON: is it a management API?") from None


def _cause(error: BaseException) -> str:
    """The innermost reason: requests wraps urllib3's errors, which wrap the socket's."""
    while True:
        inner = (error.__cause__ or error.__context__ or getattr(error, "reason", None)
                 or next(iter(error.args), None))
        if not isinstance(inner, BaseException):
            return str(error)
        error = inner


def _explain(response: requests.Response, what: str) -> tuple[str, dict]:
    """RabbitMQ's error body, {"error": ..., "reason": ...}, in a sentence; the body."""
    try:
        body = response.json()
    except (ValueError, RecursionError):
        body = {}
    if not isinstance(body, dict):
        body = {}
    reason = str(body.get("reason") or response.reason or "").strip()
    status = f"{response.status_code} {body.get('error') or response.reason}"
    if response.status_code == 401:
        reason += (f" (as user given by --user/--password, ${USER_VARIABLE}/"
                   f"${PASSWORD_VARIABLE} or the configuration file)")
    lines = [f"{what}: {reason} [{status}]"]
    lines += [f"  {problem}" for problem in body.get("problems", [])]
    return "\n".join(lines), body


# -- output -------------------------------------------------------------------------------

def cell(row: dict, column: str):
    """A column's value; a dotted column reaches into objects (message_stats.publish)."""
    if column == "queue" and isinstance(row.get("queue"), dict):
        return row["queue"].get("name")
    if column == "channel" and "channel_details" in row:
        return row["channel_details"].get("name")
    value = row
    for part in column.split(".") if column not in row else [column]:
        value = value.get(part) if isinstance(value, dict) else None
    return value


def text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, dict) or (isinstance(value, list) and not all(
            isinstance(item, (str, int, float)) for item in value)):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, list):
        return ",".join(map(str, value))  # tags
    return str(value)


def render(rows: list[dict], columns: list[str], form: str, whole_rows: bool) -> str:
    """Rows as a table, TSV (with a header line) or JSON (whole objects unless
    columns were asked for)."""
    if form == "json":
        chosen = rows if whole_rows else [{c: cell(row, c) for c in columns} for row in rows]
        return json.dumps(chosen, indent=2)
    cells = [[text(cell(row, c)) for c in columns] for row in rows]
    if form == "tsv":
        return "\n".join("\t".join(line) for line in [columns, *cells])
    return tabulate.tabulate(cells, headers=columns, tablefmt="simple", disable_numparse=True)
