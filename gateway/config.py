"""Warren's configuration: `warren.toml`, validated with msgspec, and the command
line, which can set every option too (command line > file > defaults).

Every option is a top-level key of the file; its command-line form is
`--key-with-dashes`. A wrong key, type or value is a ConfigError naming it, and
the broker does not start.
"""

from __future__ import annotations

import argparse
import os
import tomllib

import msgspec

from warren.shards.logsetup import FORMATS, LEVELS, LogSettings
from warren.shards.records import MAX_GATEWAYS

MAX_MESSAGE_SIZE_LIMIT = 536_870_912  # RabbitMQ's ceiling for max_message_size


class ConfigError(Exception):
    pass


class Config(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The options, their defaults (RabbitMQ's where it has one) and their help."""

    bind: str = "127.0.0.1"
    port: int = 5672
    data_dir: str = "./warren-data"
    shards: int = 0
    gateways: int = 0
    frame_max: int = 131072
    heartbeat: int = 60
    tcp_recbuf: int = 262_144
    channel_max: int = 2047
    max_message_size: int = 134_217_728
    memory_limit: int = -1
    disk_free_limit: int = 50_000_000
    consumer_timeout: int = 1_800_000
    log_dir: str = ""
    log_level: str = "info"
    log_file: str = "-"
    log_format: str = "text"
    log_file_rotation_size: int = 10 << 20
    log_file_rotation_count: int = 5
    stats_interval: float = 5.0
    store_map_size: int = 32 << 30
    tls_port: int = 5671
    tls_certfile: str = ""
    tls_keyfile: str = ""
    tls_cafile: str = ""
    tls_verify_peer: bool = False
    management_bind: str = "127.0.0.1"
    management_port: int = 15672
    management_request_timeout: float = 5.0
    management_max_connections: int = 512
    management_max_connections_per_address: int = 64
    prometheus_authentication: bool = False
    default_user: str = "guest"
    default_pass: str = "guest"
    default_vhost: str = "/"
    loopback_users: list[str] = msgspec.field(default_factory=lambda: ["guest"])
    quarantine_damaged: bool = False
    rebuild_definitions: bool = False
    load_compaction: bool = True
    cluster: list[str] = msgspec.field(default_factory=list)
    node_name: str = ""
    advertise: str = ""
    cluster_port: int = -1
    cluster_prefix: str = "/warren"
    cluster_secret: str = ""
    cluster_lease_ttl: int = 5
    queue_leader_locator: str = "balanced"

    @property
    def tls_enabled(self) -> bool:
        return bool(self.tls_certfile)

    def shard_count(self) -> int:
        return self.shards or os.cpu_count() or 1

    def gateway_count(self) -> int:
        """Gateway processes accepting clients: as given, else one per two CPUs (one
        on two cores or fewer), at most MAX_GATEWAYS - 1."""
        return self.gateways or min(MAX_GATEWAYS - 1, max(1, (os.cpu_count() or 1) // 2))

    def ring_pairs(self) -> int:
        """Ring pairs per shard, one for each process that talks to it: the one
        gateway, or the gateways and the root, which serves no clients when there
        are several (docs/architecture.md); in a cluster one more, the inter-node
        link's (cluster/relay.py)."""
        count = self.gateway_count()
        return (1 if count == 1 else count + 1) + (1 if self.cluster else 0)

    def link_port(self) -> int:
        """The inter-node link's port: as given, else the AMQP port + 20000, as
        RabbitMQ's distribution port (a free one when the AMQP port is)."""
        if self.cluster_port >= 0:
            return self.cluster_port
        return self.port + 20000 if self.port else 0

    def memory_limit_bytes(self) -> int:
        """As RabbitMQ's vm_memory_high_watermark: 40% of the machine's memory."""
        if self.memory_limit >= 0:
            return self.memory_limit
        return int(0.4 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))

    def logs_dir(self) -> str:
        return self.log_dir or os.path.join(self.data_dir, "logs")

    def log_settings(self) -> LogSettings:
        """The operator log's settings, which the shards are given too."""
        path = self.log_file if self.log_file == "-" else os.path.abspath(self.log_file)
        return LogSettings(self.log_level, path, self.log_format,
                           self.log_file_rotation_size, self.log_file_rotation_count)


HELP = {
    "bind": "address of the AMQP listener",
    "port": "AMQP port (0: any free port)",
    "data_dir": "data directory",
    "shards": "shard processes (0: one per CPU)",
    "gateways": "gateway processes serving the AMQP clients (0: one per two CPUs)",
    "frame_max": "largest frame offered to clients, bytes",
    "heartbeat": "heartbeat interval offered to clients, seconds (0: off)",
    "tcp_recbuf": "kernel receive buffer of each client connection, bytes, as RabbitMQ's "
                  "tcp_listen_options.recbuf (0: the OS's autotuning)",
    "channel_max": "most channels per connection",
    "max_message_size": "largest message body accepted, bytes (RabbitMQ's default 128 MiB)",
    "memory_limit": "message content in RAM before publishers are blocked, bytes "
                    "(-1: 40%% of the machine's memory)",
    "disk_free_limit": "free disk below which publishers are blocked, bytes",
    "consumer_timeout": "default delivery acknowledgement timeout of quorum queues and "
                        "streams, ms",
    "log_dir": "directory of the shards' statistics logs (default DATA/logs)",
    "log_level": "operator log level: debug, info, warning, error or critical",
    "log_file": "operator log file, rotated by size (-: standard error)",
    "log_format": "operator log lines: text (as RabbitMQ's) or json (one object a line)",
    "log_file_rotation_size": "bytes after which the log file is rotated (0: never)",
    "log_file_rotation_count": "rotated log files kept (FILE.1 ... FILE.N)",
    "stats_interval": "seconds between statistics records",
    "store_map_size": "LMDB map size of each shard store, bytes (sparse)",
    "tls_port": "AMQPS port, used when tls_certfile is set (0: any free port)",
    "tls_certfile": "PEM certificate (chain) of the AMQPS listener",
    "tls_keyfile": "PEM private key of the AMQPS listener",
    "tls_cafile": "PEM CA bundle to verify client certificates with",
    "tls_verify_peer": "require a client certificate signed by tls_cafile",
    "management_bind": "address of the management HTTP API",
    "management_port": "management HTTP port (0: no management listener)",
    "management_request_timeout": "seconds a management connection has to send a whole "
                                  "request (head and body) before it is closed, as "
                                  "RabbitMQ's 5 s",
    "management_max_connections": "management HTTP connections open at once, at most "
                                  "(and at most a quarter of the descriptor limit)",
    "management_max_connections_per_address": "management HTTP connections open at once "
                                              "from one address, at most",
    "prometheus_authentication": "/metrics and /metrics/per-object need a user tagged "
                                 "monitoring or administrator, as RabbitMQ's "
                                 "prometheus.authentication.enabled",
    "default_user": "user created in a new data directory",
    "default_pass": "password of that user",
    "default_vhost": "vhost created in a new data directory",
    "loopback_users": "users that may only connect from loopback (comma-separated)",
    "quarantine_damaged": "start although shard stores are damaged: move them to "
                          "DATA/quarantine/ and serve what of them still reads",
    "rebuild_definitions": "start although meta/ is missing or damaged: rebuild the queue "
                           "definitions from the shard stores",
    "load_compaction": "while the broker uses under half a core, run all its processes "
                       "on one CPU, where waking each other costs less (as Erlang's +scl)",
    "cluster": "etcd endpoints of the cluster to join or form (http://HOST:2379,...; "
               "none: this node runs alone)",
    "node_name": "this node's name in the cluster (default warren@HOSTNAME)",
    "advertise": "HOST:PORT the other nodes reach this node's inter-node link at "
                 "(default the bind address and cluster_port)",
    "cluster_port": "port of the inter-node link (-1: the AMQP port + 20000, as "
                    "RabbitMQ's distribution port)",
    "cluster_prefix": "etcd key prefix that names the cluster",
    "cluster_secret": "secret the nodes authenticate each other with (configuration "
                      "file only; default one kept in etcd)",
    "cluster_lease_ttl": "seconds after which a node that stopped answering etcd is "
                         "seen as down",
    "queue_leader_locator": "node a new queue goes to in a cluster: balanced (the node "
                            "with the fewest queues) or client-local, as RabbitMQ's "
                            "queue_leader_locator",
}
# Options never taken from the command line, which every local user can read.
FILE_ONLY = ("cluster_secret",)
# The command line's older short forms.
ALIASES = {"data_dir": ["--data"]}


def load_file(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None


def build(file_values: dict, overrides: dict, source: str = "warren.toml") -> Config:
    """The configuration from a file's values and command-line overrides."""
    try:
        config = msgspec.convert(file_values, Config)
    except msgspec.ValidationError as error:
        raise ConfigError(f"{source}: {_explain(error)}") from None
    for key, text in overrides.items():
        field_type = Config.__annotations__[key]
        try:
            if field_type == "list[str]":
                value = [part for part in text.split(",") if part]
            elif field_type == "bool":
                value = parse_boolean(text)
            else:
                value = msgspec.convert(text, {"int": int, "float": float, "str": str}[field_type],
                                        strict=False)
        except (msgspec.ValidationError, ValueError):
            raise ConfigError(f"--{key.replace('_', '-')}: expected {field_type}, "
                              f"got {text!r}") from None
        setattr(config, key, value)
    check(config)
    return config


def parse_boolean(text: str) -> bool:
    """true/false, 1/0, yes/no, on/off (ValueError otherwise)."""
    lowered = text.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ValueError(text)


def _explain(error: msgspec.ValidationError) -> str:
    """msgspec's message with the key named plainly ('$.port' -> 'port')."""
    text = str(error)
    if " - at `$." in text:
        message, where = text.rsplit(" - at `$.", 1)
        return f"{where.rstrip('`')}: {message}"
    if text.startswith("Object contains unknown field"):
        return "unknown key " + text.split("unknown field ", 1)[1]
    return text


def check(config: Config) -> None:
    """Values msgspec's types cannot express."""
    def fail(key: str, why: str) -> None:
        raise ConfigError(f"{key}: {why} (got {getattr(config, key)!r})")

    for key in ("port", "tls_port", "management_port"):
        if not 0 <= getattr(config, key) <= 65535:
            fail(key, "must be a port number, 0-65535")
    if config.management_request_timeout <= 0:
        fail("management_request_timeout", "must be positive")
    for key in ("management_max_connections", "management_max_connections_per_address"):
        if getattr(config, key) < 1:
            fail(key, "must be 1 or more")
    if config.shards < 0:
        fail("shards", "must be 0 (one per CPU) or more")
    if not 0 <= config.gateways < MAX_GATEWAYS:
        fail("gateways", f"must be 0 (one per two CPUs) to {MAX_GATEWAYS - 1}")
    if config.frame_max < 4096:
        fail("frame_max", "must be at least 4096")
    if not 0 <= config.heartbeat <= 65535:
        fail("heartbeat", "must be 0-65535 seconds")
    if config.tcp_recbuf and not 4096 <= config.tcp_recbuf <= 1 << 30:
        fail("tcp_recbuf", "must be 0 (the OS tunes it) or 4096 bytes to 1 GiB")
    if not 1 <= config.channel_max <= 65535:
        fail("channel_max", "must be 1-65535")
    if not 1 <= config.max_message_size <= MAX_MESSAGE_SIZE_LIMIT:
        fail("max_message_size", f"must be 1-{MAX_MESSAGE_SIZE_LIMIT}")
    if config.consumer_timeout < 1:
        fail("consumer_timeout", "must be a positive number of milliseconds")
    if config.log_level not in LEVELS:
        fail("log_level", f"must be one of {', '.join(LEVELS)}")
    if config.log_format not in FORMATS:
        fail("log_format", f"must be one of {', '.join(FORMATS)}")
    if config.log_file_rotation_size < 0:
        fail("log_file_rotation_size", "must be 0 (never rotate) or more bytes")
    if config.log_file_rotation_count < 0:
        fail("log_file_rotation_count", "must be 0 or more files")
    if config.stats_interval <= 0:
        fail("stats_interval", "must be positive")
    if not -1 <= config.cluster_port <= 65535:
        fail("cluster_port", "must be a port number, 0-65535, or -1")
    if config.cluster_lease_ttl < 2:
        fail("cluster_lease_ttl", "must be 2 seconds or more")
    if config.queue_leader_locator not in ("balanced", "client-local"):
        fail("queue_leader_locator", "must be balanced or client-local")
    if config.advertise and not _host_port(config.advertise):
        fail("advertise", "must be HOST:PORT")
    for endpoint in config.cluster:
        if not endpoint.startswith(("http://", "https://")):
            fail("cluster", "must be etcd endpoint URLs, http://HOST:PORT")
    if config.tls_certfile and not config.tls_keyfile:
        fail("tls_keyfile", "is required with tls_certfile")
    if config.tls_verify_peer and not config.tls_cafile:
        fail("tls_cafile", "is required with tls_verify_peer")
    for key in ("tls_certfile", "tls_keyfile", "tls_cafile"):
        path = getattr(config, key)
        if path and not os.path.isfile(path):
            fail(key, "no such file")


def _host_port(text: str) -> bool:
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) <= 65535


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One command-line option per configuration key, defaulting to 'not given'."""
    parser.add_argument("--config", metavar="FILE",
                        help="configuration file (warren.toml); command-line options win")
    for name in Config.__struct_fields__:
        if name in FILE_ONLY:
            continue
        flag = Config.__annotations__[name] == "bool"  # `--flag` alone means true
        parser.add_argument(f"--{name.replace('_', '-')}", *ALIASES.get(name, []), dest=name,
                            default=None, metavar=name.upper(), help=HELP[name],
                            nargs="?" if flag else None, const="true" if flag else None)


def from_arguments(args: argparse.Namespace) -> Config:
    file_values = load_file(args.config) if args.config else {}
    overrides = {name: getattr(args, name) for name in Config.__struct_fields__
                 if name not in FILE_ONLY and getattr(args, name) is not None}
    return build(file_values, overrides, args.config or "warren.toml")
