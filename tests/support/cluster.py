"""A Warren cluster for end-to-end tests: a real etcd (tests/support/etcd.py) and
real `warren serve` nodes joined to it, each on free loopback ports with its
own data directory. Nodes stop, start again on the same data, or die by
kill -9; etcd stops and starts the same way. A replica group's keys are read
from etcd as they are (Cluster.group)."""

from __future__ import annotations

import base64
import json
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pika

from warren.gateway.cluster import layout

from .broker import RunningBroker, free_port
from .etcd import EtcdServer, etcd_or_skip

PREFIX = "/test"  # the nodes' --cluster-prefix


@dataclass(frozen=True)
class Group:
    """A replica group's keys in etcd."""

    leader: str | None  # None during an election
    epoch: int  # the leader key's create revision
    in_sync: list[str]
    in_sync_revision: int  # the in-sync key's last write


class Node(RunningBroker):
    """One node: a RunningBroker joined to the cluster under `name`."""

    def __init__(self, folder: Path, name: str, endpoint: str, shards: int = 1,
                 lease_ttl: int = 3, extra: list[str] | None = None, host: str = "127.0.0.1",
                 prefix: list[str] | None = None, gateways: int = 1):
        self.name = name
        self.link_port = free_port()
        super().__init__(folder / name, shards=shards, management=True, gateways=gateways,
                         host=host, prefix=prefix,
                         extra_args=["--cluster", endpoint, "--node-name", name,
                                     "--cluster-port", str(self.link_port),
                                     "--cluster-lease-ttl", str(lease_ttl),
                                     "--cluster-prefix", PREFIX,
                                     # guest logs in over a namespace's link too
                                     *(["--loopback-users", ""] if host != "127.0.0.1" else []),
                                     *(extra or [])])

    def api(self, path: str, method: str = "GET", body=None, user: str = "guest:guest"):
        """The management API's JSON answer (None for an empty one)."""
        request = urllib.request.Request(self.http_url + "/api/" + path, method=method,
                                         data=None if body is None else json.dumps(body).encode())
        request.add_header("Authorization", "Basic " + base64.b64encode(user.encode()).decode())
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as answer:
            text = answer.read()
        return json.loads(text) if text else None

    def kill(self) -> None:
        """kill -9, as a crash."""
        self.process.kill()
        self.process.wait()
        if self.process.stdout:
            self.process.stdout.close()
        self.log.close()

    def running_nodes(self) -> set[str]:
        return {n["name"] for n in self.api("nodes") if n["running"]}


class Cluster:
    def __init__(self, folder: Path, size: int = 3, shards: int = 1, lease_ttl: int = 3,
                 extra: list[str] | None = None, namespace=None, gateways: int = 1):
        """With `namespace` (support/netns.py), the last node runs inside it and the
        others, and etcd, on the host's end of its link."""
        self.folder = folder
        host = namespace.host_ip if namespace is not None else "127.0.0.1"
        self.etcd: EtcdServer = etcd_or_skip(also=host if namespace is not None else "")
        endpoint = f"http://{host}:{self.etcd.client_port}"
        self.nodes = [Node(folder, f"n{i + 1}", endpoint, shards, lease_ttl, extra, host,
                           gateways=gateways)
                      for i in range(size - (namespace is not None))]
        if namespace is not None:
            self.nodes.append(Node(folder, f"n{size}", endpoint, shards, lease_ttl, extra,
                                   namespace.inside_ip, namespace.prefix))

    def start(self) -> "Cluster":
        self.etcd.start()
        for node in self.nodes:
            node.start()
        wait_for(lambda: all(len(n.running_nodes()) == len(self.nodes) for n in self.nodes),
                 30, "every node sees every other running")
        return self

    def stop(self) -> None:
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                node.stop()
        self.etcd.cleanup()

    def assert_no_traceback(self) -> None:
        """The nodes still running logged no traceback."""
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                assert "Traceback" not in node.log_text(), node.log_text()

    def __enter__(self) -> "Cluster":
        return self.start()

    def group(self, queue: str, vhost: str = "/") -> Group:
        """A replica group as etcd holds it now."""
        keys = layout.Layout(PREFIX)
        leader = self._get(keys.group_leader(vhost, queue))
        in_sync = self._get(keys.group_isr(vhost, queue))
        return Group(None if leader is None else layout.decode_leader(leader["value"]).node,
                     0 if leader is None else int(leader["create_revision"]),
                     [] if in_sync is None else layout.decode_in_sync(in_sync["value"]).nodes,
                     0 if in_sync is None else int(in_sync["mod_revision"]))

    def _get(self, key: bytes) -> dict | None:
        """A key's value (decoded) and revisions in etcd, None if there is no such key."""
        kvs = self.etcd.call("/v3/kv/range", {"key": base64.b64encode(key).decode()}).get("kvs")
        return {**kvs[0], "value": base64.b64decode(kvs[0]["value"])} if kvs else None

    def __exit__(self, *exc_info) -> None:
        self.stop()


def wait_for(condition, timeout: float, what: str, interval: float = 0.05):
    """Until `condition()` is true (returned), or fail saying `what` never happened."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            result = condition()
            if result:
                return result
        except Exception as error:  # a node restarting: its API answers later
            last_error = error
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout} s (last error: {last_error!r})")


def connect(node) -> pika.BlockingConnection:
    """A pika connection to a node, one attempt."""
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", node.port, credentials=pika.PlainCredentials("guest", "guest"),
        connection_attempts=1))


def consume_until(node, queue: str, expected: set[bytes], timeout: float = 20.0) -> set[bytes]:
    """Consume until every body of `expected` came (duplicates allowed), acking."""
    connection = connect(node)
    got: set[bytes] = set()
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=200)
        for method, _, body in channel.consume(queue, inactivity_timeout=timeout):
            if method is None:
                break
            got.add(body)
            channel.basic_ack(method.delivery_tag)
            if expected <= got:
                break
        channel.cancel()
    finally:
        connection.close()
    return got
