"""`python3 -m warren.loadtest.cluster --external-client PATH`: amqp-perf across the nodes
of a cluster, its publishers on one node and its consumers on another, on a RabbitMQ
cluster and a Warren cluster of three nodes each, started for the occasion one after the
other.

For each scenario (the bench's transient-autoack, persistent-confirm and fanout-4x4:
amqp-perf's transient-autoack, durable-confirm and fanout4) and each placement it runs

    PATH --url PUBLISHER_URL [--consumer-url CONSUMER_URL] --scenario NAME --seconds N
         --json --pid PID,PID,... [--rate R]

Placements: "1->2" (publishers on node 1, consumers on node 2) and "1->1" (all on node
1: the same work without the hop between nodes). amqp-perf declares its queues through
--url, so under RabbitMQ's default placement (client-local) they live on the publishers'
node and every delivery crosses to the consumers' node. --pid names every node's broker
process (amqp-perf adds their descendants), so the broker's CPU is the whole cluster's.
A row is the bench's row for the scenario plus the placement and the broker's CPU per
message (µs over the larger of the published and the consumed count); the hop's cost is
the ratio of a scenario's two placements.

`measure` is the part a Warren cluster reuses: the two roles' URLs and the broker pids
in, one row out. Only an amqp-perf with --consumer-url (see `supports_consumer_url`)
can put the two roles on different nodes.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import external
from .fastclient import AMQPError, FastClient
from .output import log, print_json
from .procs import free_port, wait_for_port
from .targets import RABBIT_BIN, rabbitmq_missing

SCENARIOS = ["transient-autoack", "persistent-confirm", "fanout-4x4"]

# (label, publishers' node, consumers' node), nodes counted from 0
PLACEMENTS = [("1->2", 0, 1), ("1->1", 0, 0)]


def command(path: str, publisher_url: str, consumer_url: str, scenario: str, seconds: float,
            pids: list[int], rate: float = 0.0, queue_type: str = "") -> list[str]:
    """amqp-perf's command line for the bench's scenario `scenario`, its consumers on
    `consumer_url` when that is not the publishers' URL."""
    argv = [path, "--url", publisher_url]
    if consumer_url != publisher_url:
        argv += ["--consumer-url", consumer_url]
    argv += ["--scenario", external.EXTERNAL_NAMES.get(scenario, scenario),
             "--seconds", f"{seconds:g}", "--json"]
    if pids:
        argv += ["--pid", ",".join(str(pid) for pid in pids)]
    if rate:
        argv += ["--rate", f"{rate:g}"]
    if queue_type:
        argv += ["--queue-type", queue_type]
    return argv


def supports_consumer_url(path: str) -> bool:
    """Whether this amqp-perf takes --consumer-url (its usage lists every flag)."""
    try:
        done = subprocess.run([path, "-h"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "-consumer-url" in done.stdout + done.stderr


def cpu_us_per_message(row: dict[str, Any]) -> float | None:
    """The broker's CPU µs per message in the window: over the larger of the published
    and the consumed count, since a flood that outruns its consumers still costs the
    broker every message it takes in."""
    cpu = row.get("broker_cpu_s")
    messages = max(row.get("published") or 0, row.get("consumed") or 0)
    if not isinstance(cpu, (int, float)) or not messages:
        return None
    return cpu * 1e6 / messages


def measure(path: str, scenario: str, publisher_url: str, consumer_url: str,
            pids: list[int], seconds: float, *, rate: float = 0.0, broker: str = "cluster",
            placement: str = "", queue_type: str = "") -> dict[str, Any]:
    """Run amqp-perf once for the bench's scenario `scenario`, its publishers on
    `publisher_url` and its consumers on `consumer_url`, the broker's CPU summed over
    the process trees of `pids`; one row, never raising for amqp-perf's own failures."""
    argv = command(path, publisher_url, consumer_url, scenario, seconds, pids, rate, queue_type)
    row: dict[str, Any] = {"type": "cluster", "scenario": scenario, "broker": broker,
                           "placement": placement, "queue_type": queue_type or "classic",
                           "client": external.client_label(path),
                           "client_scenario": argv[argv.index("--scenario") + 1],
                           "rate": rate, "status": "ok", "command": shlex.join(argv)}
    started = time.monotonic()
    try:
        stdout, stderr, returncode = external._execute(
            argv, seconds + external.WARMUP_S + external.WATCHDOG_S + 30)
    except OSError as error:
        row.update(status="error", error=f"cannot run {path}: {error}")
        return row
    finally:
        row["seconds"] = round(time.monotonic() - started, 2)
    result = external.parse_json_line(stdout)
    if result is None:
        tail = (stderr.strip() or stdout.strip() or "no output").splitlines()[-1][:300]
        row.update(status="error", error=(
            "timed out" if returncode is None else f"exit status {returncode}")
            + f", no JSON line: {tail}")
        return row
    row.update(external._figures(result))
    row["broker_cpu_us_per_msg"] = cpu_us_per_message(row)
    # The host's CPU that neither the broker nor amqp-perf used: others' load, which
    # skews a run on a shared machine.
    row["other_cores_avg"] = result.get("other_cores_avg")
    row["external"] = result
    if not result.get("ok") or returncode != 0:
        row.update(status="error", error=str(result.get("error") or "ok is not true"))
    return row


def hop_cost(cross: dict[str, Any], local: dict[str, Any]) -> dict[str, Any]:
    """A scenario's figures across nodes over the same on one node (None where either
    is missing or the run failed)."""
    ratios: dict[str, Any] = {"type": "hop", "scenario": cross["scenario"],
                              "broker": cross["broker"]}
    ok = cross["status"] == local["status"] == "ok"
    for key in ("published_per_s", "consumed_per_s", "broker_cpu_us_per_msg", "e2e_p99_ms"):
        a, b = cross.get(key), local.get(key)
        ratios[key] = a / b if ok and isinstance(a, (int, float)) and b else None
    return ratios


# (key, title, format) of the cluster table
COLUMNS = [("published_per_s", "pub/s", "{:,.0f}"), ("consumed_per_s", "cons/s", "{:,.0f}"),
           ("e2e_p50_ms", "e2e p50", "{:.2f}"), ("e2e_p99_ms", "e2e p99", "{:.2f}"),
           ("confirm_p99_ms", "conf p99", "{:.2f}"), ("broker_cores_avg", "brk cores", "{:.2f}"),
           ("broker_cpu_us_per_msg", "brk µs/msg", "{:.1f}"),
           ("left_in_queues_at_end", "left", "{:,}"),
           ("other_cores_avg", "others' cores", "{:.2f}")]
HOP_COLUMNS = [("published_per_s", "pub/s"), ("consumed_per_s", "cons/s"),
               ("broker_cpu_us_per_msg", "µs/msg"), ("e2e_p99_ms", "e2e p99")]


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _lines(header: list[str], rows: list[list[str]], text_columns: int) -> str:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    return "\n".join("  ".join(cell.ljust(width) if i < text_columns else cell.rjust(width)
                               for i, (cell, width) in enumerate(zip(cells, widths))).rstrip()
                     for cells in [header, ["-" * width for width in widths], *rows])


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The measured rows, one line each, the status last."""
    header = ["scenario", "broker", "queue", "pub->con"] + [title for _, title, _ in COLUMNS] \
        + ["status"]
    lines = [[row["scenario"], row["broker"], row.get("queue_type", "classic"), row["placement"]]
             + [_cell(row.get(key), fmt) for key, _, fmt in COLUMNS]
             + [row["status"] + (": " + row["error"][:80] if row.get("error") else "")]
             for row in rows]
    return _lines(header, lines, text_columns=4)


def format_hops(hops: list[dict[str, Any]]) -> str:
    """Each scenario's cost of the hop: across nodes over on one node."""
    header = ["scenario", "broker"] + [f"{title} 1->2/1->1" for _, title in HOP_COLUMNS]
    lines = [[hop["scenario"], hop["broker"]] + [_cell(hop[key], "{:.2f}")
                                                 for key, _ in HOP_COLUMNS] for hop in hops]
    return _lines(header, lines, text_columns=2)


def node_config(amqp_port: int) -> str:
    """A node's rabbitmq.conf: as the bench's single RabbitMQ node (targets.RabbitTarget)."""
    return ("loopback_users = none\n"
            f"listeners.tcp.default = 127.0.0.1:{amqp_port}\n"
            "vm_memory_high_watermark.relative = 0.4\n"
            "disk_free_limit.absolute = 50MB\n")


def node_env(base: dict[str, str], home: Path, node_dir: Path, nodename: str, amqp_port: int,
             dist_port: int, epmd_port: int) -> dict[str, str]:
    """One node's environment: its own dirs and ports, the cluster's epmd and cookie (in
    `home`), the distribution on loopback only."""
    env = dict(base,
               HOME=str(home),
               RABBITMQ_NODENAME=nodename,
               RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
               RABBITMQ_NODE_PORT=str(amqp_port),
               RABBITMQ_DIST_PORT=str(dist_port),
               ERL_EPMD_PORT=str(epmd_port),
               ERL_EPMD_ADDRESS="127.0.0.1",
               RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
               RABBITMQ_CONFIG_FILE=str(node_dir / "rabbitmq.conf"),
               RABBITMQ_ENABLED_PLUGINS_FILE=str(node_dir / "enabled_plugins"),
               RABBITMQ_MNESIA_BASE=str(node_dir / "mnesia"),
               RABBITMQ_MNESIA_DIR=str(node_dir / "mnesia" / nodename),
               RABBITMQ_LOG_BASE=str(node_dir / "log"),
               RABBITMQ_LOGS=str(node_dir / "log" / "rabbit.log"),
               RABBITMQ_PID_FILE=str(node_dir / "rabbit.pid"))
    env.pop("RABBITMQ_ALLOW_INPUT", None)  # any value, even "false", means a shell
    return env


class RabbitCluster:
    """Private RabbitMQ nodes joined into one cluster on the caller's AMQP and
    distribution ports: temp dirs, their own epmd and cookie, our own process groups."""

    label = "rabbitmq"

    def __init__(self, amqp_ports: list[int], dist_ports: list[int], epmd_port: int,
                 start_timeout: float = 120.0):
        missing = rabbitmq_missing()
        if missing:
            raise RuntimeError(missing)
        self.tmp = Path(tempfile.mkdtemp(prefix="warren-bench-rabbit-cluster-"))
        home = self.tmp / "home"
        home.mkdir()
        cookie = home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16))
        cookie.chmod(0o400)
        tag = f"{os.getpid()}-{secrets.token_hex(2)}"
        self.nodenames = [f"warrenbench{i + 1}-{tag}@localhost" for i in range(len(amqp_ports))]
        self.urls = [f"amqp://guest:guest@127.0.0.1:{port}/%2F" for port in amqp_ports]
        self.envs, self.processes, self.logs = [], [], []
        try:
            for nodename, amqp_port, dist_port in zip(self.nodenames, amqp_ports, dist_ports):
                node_dir = self.tmp / nodename.partition("@")[0]
                node_dir.mkdir()
                (node_dir / "rabbitmq.conf").write_text(node_config(amqp_port))
                (node_dir / "enabled_plugins").write_text("[].\n")
                env = node_env(os.environ, home, node_dir, nodename, amqp_port, dist_port,
                               epmd_port)
                self.envs.append(env)
                self.logs.append(open(node_dir / "stdout.log", "ab"))
                self.processes.append(subprocess.Popen(
                    [str(RABBIT_BIN / "rabbitmq-server")], env=env, cwd=node_dir,
                    stdout=self.logs[-1], stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True))
            for process, port in zip(self.processes, amqp_ports):
                if not wait_for_port(port, start_timeout, lambda: process.poll() is None):
                    raise RuntimeError(f"a RabbitMQ node did not open port {port} within "
                                       f"{start_timeout}s; logs under {self.tmp}")
            for i in range(1, len(self.nodenames)):
                for args in (["stop_app"], ["join_cluster", self.nodenames[0]], ["start_app"]):
                    self.ctl(i, *args)
            for url in self.urls:
                _wait_amqp(url, 60.0)
        except BaseException:
            self.stop()
            raise
        log(f"# started a RabbitMQ cluster of {len(self.urls)} nodes on AMQP ports "
            f"{', '.join(map(str, amqp_ports))} (pids {', '.join(map(str, self.pids()))})")

    def ctl(self, node: int, *args: str) -> None:
        """rabbitmqctl against node `node` (from 0); raises when it fails."""
        done = subprocess.run([str(RABBIT_BIN / "rabbitmqctl"), "-n", self.nodenames[node],
                               *args], env=self.envs[node], capture_output=True, text=True,
                              timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} on {self.nodenames[node]}: "
                               f"{(done.stderr or done.stdout).strip()[-500:]}")

    def pids(self) -> list[int]:
        """The root of each node's process tree (rabbitmq-server; beam is in its tree)."""
        return [process.pid for process in self.processes]

    def stop(self) -> None:
        for node, process in reversed(list(enumerate(self.processes))):
            if process.poll() is None:
                try:
                    self.ctl(node, "stop")
                    process.wait(30)
                except (RuntimeError, OSError, subprocess.TimeoutExpired):
                    pass
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait()
        if self.envs:  # the cluster's own epmd outlives its nodes
            epmd = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
            try:
                subprocess.run([epmd, "-kill"], env=self.envs[0], timeout=10,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            except (OSError, subprocess.TimeoutExpired):
                pass
        for file in self.logs:
            file.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class WarrenCluster:
    """Warren nodes joined into one cluster on a private etcd (Debian's etcd-server),
    each node with one shard and one gateway process (three nodes share the 2 cores
    of the machine this was made on), queues placed as RabbitMQ places them by
    default (client-local), so the two clusters carry the same traffic."""

    label = "warren"

    def __init__(self, amqp_ports: list[int], start_timeout: float = 60.0):
        etcd = shutil.which("etcd") or "/usr/bin/etcd"
        if not os.path.exists(etcd):
            raise RuntimeError("no etcd: apt-get install etcd-server")
        self.tmp = Path(tempfile.mkdtemp(prefix="warren-bench-cluster-"))
        self.urls = [f"amqp://guest:guest@127.0.0.1:{port}/%2F" for port in amqp_ports]
        self.processes: list[subprocess.Popen] = []
        self.logs: list = []
        client, peer = free_port(), free_port()
        endpoint = f"http://127.0.0.1:{client}"
        try:
            self._spawn([etcd, "--name", "bench", "--data-dir", str(self.tmp / "etcd"),
                         "--listen-client-urls", endpoint, "--advertise-client-urls", endpoint,
                         "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                         "--initial-cluster", f"bench=http://127.0.0.1:{peer}",
                         "--log-level", "warn"], "etcd")
            if not wait_for_port(client, start_timeout, lambda: self.processes[0].poll() is None):
                raise RuntimeError(f"etcd did not open port {client}; logs under {self.tmp}")
            for number, port in enumerate(amqp_ports, 1):
                self._spawn([sys.executable, "-m", "warren.gateway.cli.main", "serve",
                             "--cluster", endpoint, "--node-name", f"bench{number}",
                             "--port", str(port), "--cluster-port", str(free_port()),
                             "--management-port", "0", "--data", str(self.tmp / f"n{number}"),
                             "--shards", "1", "--gateways", "1",
                             "--queue-leader-locator", "client-local"], f"n{number}")
            for process, port in zip(self.processes[1:], amqp_ports):
                if not wait_for_port(port, start_timeout, lambda p=process: p.poll() is None):
                    raise RuntimeError(f"a Warren node did not open port {port}; logs under "
                                       f"{self.tmp}")
            for url in self.urls:
                _wait_amqp(url, 60.0)
            _wait_linked(self.urls, 60.0)
        except BaseException:
            self.stop()
            raise
        log(f"# started a Warren cluster of {len(self.urls)} nodes on AMQP ports "
            f"{', '.join(map(str, amqp_ports))} (pids {', '.join(map(str, self.pids()))})")

    def _spawn(self, argv: list[str], name: str) -> None:
        self.logs.append(open(self.tmp / f"{name}.log", "ab"))
        self.processes.append(subprocess.Popen(argv, stdout=self.logs[-1],
                                               stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, start_new_session=True))

    def pids(self) -> list[int]:
        """The nodes' roots (their shards are in their trees) and etcd: the cluster's
        coordination is part of its cost, as Erlang's distribution is RabbitMQ's."""
        return [process.pid for process in self.processes]

    def stop(self) -> None:
        for process in reversed(self.processes):  # the nodes, then etcd
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        for file in self.logs:
            file.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


BROKERS = {"rabbitmq": RabbitCluster, "warren": WarrenCluster}


def _wait_amqp(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            FastClient(url, timeout=5).close()
            return
        except (OSError, AMQPError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _wait_linked(urls: list[str], timeout: float) -> None:
    """Until every node reaches a queue on every other: a node accepts clients
    before its links to the others are up, and a queue on a node it has no link
    to yet answers 404 (its node out of reach). A probe queue on each node (the
    nodes place queues where they are declared), declared passively through
    the others, then deleted."""
    deadline = time.monotonic() + timeout
    for home, url in enumerate(urls):
        probe = f"warren.bench.linked.{home}"
        client = FastClient(url, timeout=5)
        client.queue_declare(client.open_channel(), probe, durable=True)
        for other in urls:
            if other == url:
                continue
            while True:
                peer = FastClient(other, timeout=5)
                try:
                    peer.queue_declare(peer.open_channel(), probe, passive=True)
                    break
                except AMQPError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
                finally:
                    peer.abort()
        client.queue_delete(client.open_channel(), probe)
        client.close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python3 -m warren.loadtest.cluster", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--external-client", metavar="PATH", required=True,
                        help="amqp-perf with --consumer-url")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help="comma-separated scenarios, the bench's or amqp-perf's names "
                             f"(default {','.join(SCENARIOS)})")
    parser.add_argument("--duration", type=float, default=10.0,
                        help="seconds measured per scenario and placement (default 10)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="messages/s of each publisher (default 0: as fast as it can)")
    parser.add_argument("--queue-type", choices=("classic", "quorum"), default="",
                        help="x-queue-type of the durable queues: quorum queues are replicated "
                             "on every node of both clusters (default: not set = classic)")
    parser.add_argument("--brokers", default="rabbitmq,warren",
                        help="the clusters to measure, one after the other: rabbitmq, warren "
                             "(default both)")
    parser.add_argument("--ports", default=None,
                        help="the nodes' AMQP ports, comma-separated (default: three free ones)")
    parser.add_argument("--dist-ports", default=None,
                        help="the nodes' distribution ports, as many (default: free ones)")
    parser.add_argument("--epmd-port", type=int, default=None,
                        help="the cluster's own epmd port (default: a free one)")
    options = parser.parse_args(argv)
    options.scenarios = [external.canonical(name.strip())
                         for name in options.scenarios.split(",") if name.strip()]
    options.ports = ([int(port) for port in options.ports.split(",")] if options.ports
                     else [free_port() for _ in range(3)])
    options.dist_ports = ([int(port) for port in options.dist_ports.split(",")]
                          if options.dist_ports else [free_port() for _ in options.ports])
    if len(options.ports) < 2 or len(options.dist_ports) != len(options.ports):
        parser.error("give two or more --ports and as many --dist-ports")
    options.epmd_port = options.epmd_port or free_port()
    options.brokers = [name.strip() for name in options.brokers.split(",") if name.strip()]
    unknown = [name for name in options.brokers if name not in BROKERS]
    if unknown:
        parser.error(f"unknown broker {', '.join(unknown)}: rabbitmq or warren")
    return options


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    if not supports_consumer_url(options.external_client):
        log(f"{options.external_client} has no --consumer-url: it cannot put its consumers "
            "on another node")
        return 2
    rows: list[dict[str, Any]] = []
    hops: list[dict[str, Any]] = []
    for broker in options.brokers:
        cluster = (RabbitCluster(options.ports, options.dist_ports, options.epmd_port)
                   if broker == "rabbitmq" else WarrenCluster(options.ports))
        try:
            for scenario in options.scenarios:
                measured = {}
                for placement, publisher, consumer in PLACEMENTS:
                    log(f"# {cluster.label} {scenario} {placement}")
                    row = measure(options.external_client, scenario, cluster.urls[publisher],
                                  cluster.urls[consumer], cluster.pids(), options.duration,
                                  rate=options.rate, broker=cluster.label, placement=placement,
                                  queue_type=options.queue_type)
                    print_json(row)
                    rows.append(row)
                    measured[placement] = row
                hops.append(hop_cost(measured[PLACEMENTS[0][0]], measured[PLACEMENTS[1][0]]))
                print_json(hops[-1])
        finally:
            cluster.stop()
    print()
    print(format_rows(rows))
    print()
    print(format_hops(hops))
    return 0 if all(row["status"] == "ok" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
