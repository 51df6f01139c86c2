"""Smoke tests of the load-testing tools (no timing assertions): `python -m loadtest.bench
--quick` and the Locust users of loadtest/locustfile.py, each against a real broker."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pika
import pytest

from ..support.broker import ROOT, RunningBroker, free_port, stop_process

pytestmark = pytest.mark.run_once  # its brokers choose their gateway processes


@pytest.fixture(scope="module")
def bench_broker(tmp_path_factory):
    running = RunningBroker(tmp_path_factory.mktemp("loadtest") / "data", shards=2).start()
    yield running
    running.stop()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_bench_quick_scenarios(bench_broker):
    scenarios = ["transient-autoack", "persistent-confirm", "confirm-each"]
    result = subprocess.run(
        [sys.executable, "-m", "warren.loadtest.bench", "--url", bench_broker.url, "--quick",
         "--scenarios", ",".join(scenarios)],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {}
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            if row.get("type") == "scenario":
                rows[row["scenario"]] = row
    assert sorted(rows) == sorted(scenarios), result.stdout + result.stderr
    for name, row in rows.items():
        assert row["status"] == "ok", row
        assert row["delivered"] > 0, row
        # Every scenario here drains its queue before it ends.
        assert row["published"] == row["delivered"], row
        assert row["e2e_p50_ms"] is not None and row["client_cpu_s"] >= 0, row
        assert row["client"] == "warren-bench" and row["consumed"] == row["delivered"], row
        assert row["consumed_per_s"] and row["consumed_over_published"] is not None, row
    for name in ("persistent-confirm", "confirm-each"):
        assert rows[name]["confirmed"] == rows[name]["published"], rows[name]
        assert rows[name]["nacked"] == 0, rows[name]
        assert rows[name]["confirm_p99_ms"] is not None, rows[name]
    # The table is printed after the JSON lines.
    assert "scenario" in result.stdout and "cons/pub" in result.stdout


def _direct_reply_to_works(url: str) -> bool:
    """One RPC over direct reply-to with pika: consume amq.rabbitmq.reply-to (no-ack),
    publish a request with reply_to set to it, answer it from the server queue."""
    pika = pytest.importorskip("pika")
    try:
        connection = pika.BlockingConnection(pika.URLParameters(url))
    except Exception:  # noqa: BLE001
        return False
    replies = []
    try:
        channel = connection.channel()
        server_queue = channel.queue_declare("", exclusive=True).method.queue
        channel.basic_consume("amq.rabbitmq.reply-to",
                              lambda _ch, _m, props, body: replies.append(body), auto_ack=True)
        channel.basic_publish("", server_queue, b"ping",
                              pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
        deadline = time.monotonic() + 3
        method = properties = None
        while method is None and time.monotonic() < deadline:
            method, properties, _ = channel.basic_get(server_queue, auto_ack=True)
            if method is None:
                connection.process_data_events(time_limit=0.05)
        if method is None or not properties.reply_to:
            return False
        other = connection.channel()
        other.basic_publish("", properties.reply_to, b"pong")
        while not replies and time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.05)
        return replies == [b"pong"]
    except Exception:  # noqa: BLE001 - the broker refused it: not supported (yet)
        return False
    finally:
        try:
            connection.close()
        except Exception:  # noqa: BLE001
            pass


def test_locust_headless(bench_broker, tmp_path):
    # Look for locust without importing it: importing it monkey-patches this whole
    # process with gevent (sockets, subprocess), which breaks the tests that follow.
    if importlib.util.find_spec("locust") is None:
        pytest.skip("locust is not installed (the test extra installs it)")
    env = _env()
    rpc = _direct_reply_to_works(bench_broker.url)
    if not rpc:
        env["WARREN_LOCUST_RPC"] = "0"
    result = subprocess.run(
        [sys.executable, "-m", "locust", "-f", str(ROOT / "loadtest" / "locustfile.py"),
         "--headless", "-u", "4", "-r", "4", "-t", "5s", "--host", bench_broker.url,
         "--csv", str(tmp_path / "loc"), "--only-summary", "--stop-timeout", "5"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    with open(tmp_path / "loc_stats.csv", newline="") as f:
        stats = {row["Name"]: row for row in csv.DictReader(f)}
    aggregated = stats["Aggregated"]
    assert int(aggregated["Request Count"]) > 0, stats
    assert int(aggregated["Failure Count"]) == 0, stats
    assert int(stats["publish+confirm"]["Request Count"]) > 0, stats
    assert "get+ack" in stats or "get-empty" in stats, stats
    if rpc:
        assert int(stats["rpc direct-reply-to"]["Request Count"]) > 0, stats


def test_gatewaycost_measures_every_path_and_profiles():
    """`python -m warren.loadtest.probes.gatewaycost` drives an in-process gateway through
    every scenario and prints a CPU cost per message (and a profile) for each."""
    run = subprocess.run([sys.executable, "-m", "warren.loadtest.probes.gatewaycost", "-n", "300",
                          "--repeat", "1", "--profile", "--top", "3"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    costs = [line.split() for line in run.stdout.splitlines() if "µs/msg" in line]
    assert [cost[0] for cost in costs] == [
        "publish-transient", "publish-transient-confirm", "publish-persistent",
        "publish-persistent-confirm", "deliver-autoack", "deliver-manual-ack",
        "round-trip-autoack", "round-trip-manual-ack"]
    assert all(float(cost[1]) > 0 for cost in costs)
    assert run.stdout.count("tottime") == len(costs)


def test_shardcost_round_trip_delivers_each_message_in_a_turn_of_its_own():
    """`python -m warren.loadtest.probes.shardcost --round-trip` plays the gateway to a real
    shard one message at a time: every message is delivered, one per shard turn,
    and the shard's CPU per message is reported."""
    run = subprocess.run([sys.executable, "-m", "warren.loadtest.probes.shardcost", "--round-trip",
                          "--messages", "3000", "--json"],  # enough for /proc's 10 ms ticks
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.splitlines()[-1])
    assert result["messages"] == 3000 and result["nacked"] == 0, result
    assert result["msgs_per_turn"] == 1.0, result
    assert result["shard_cpu_us_per_msg"] > 0, result


@pytest.mark.parametrize("placement", [[], ["--same-cpu"]], ids=["across", "same-cpu"])
def test_wakecost_times_each_doorbell_wake_up(placement):
    """`python -m warren.loadtest.probes.wakecost` rings a sleeping process's eventfd and
    reports the CPU each side spends a wake-up: with writes far apart each one
    finds the other process asleep and wakes it once, on another CPU or (as
    under load compaction) on the waker's."""
    run = subprocess.run([sys.executable, "-m", "warren.loadtest.probes.wakecost", "--count", "300",
                          "--gap", "2000", "--turns", "1000", "--json", *placement],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["across_cpus"] is (not placement and len(os.sched_getaffinity(0)) > 1)
    assert result["writes"] == 300 and 270 <= result["wakes"] <= 300, result
    assert result["waker_us_per_write"] > 0 and result["wakee_us_per_wake"] > 0, result
    pair = result["waker_us_per_write"] + result["wakee_us_per_wake"]
    assert result["cores_at_turns"] == round(2 * pair * 1000 / 1e6, 3), result


def listening(port: int, process: subprocess.Popen, timeout: float) -> bool:
    """Whether `process` took connections on `port` before the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
            found.append(int(entry))
    return found


def test_floor_skeleton_carries_messages_through_its_shard_process():
    """`python -m warren.loadtest.probes.floor` (the process split and nothing else) takes
    real clients: a pika consumer with manual acks gets every message published,
    in order, after each crossed to the skeleton's shard process and back; SIGINT
    stops both processes."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "warren.loadtest.probes.floor", "--port", str(port)],
                              stdout=subprocess.DEVNULL)
    try:
        assert listening(port, server, 30)
        shards = [pid for pid in children(server.pid)
                  if b"--shard" in open(f"/proc/{pid}/cmdline", "rb").read()]
        assert len(shards) == 1, shards
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        channel = connection.channel()
        queue = channel.queue_declare("floor-test").method.queue
        got = []

        def on_message(ch, deliver, properties, body):
            got.append((body, properties.content_type))
            ch.basic_ack(deliver.delivery_tag)

        channel.basic_consume(queue, on_message)
        sent = [f"message {i}".encode() for i in range(200)]
        for body in sent:
            channel.basic_publish("", queue, body, pika.BasicProperties(content_type="text/plain"))
        deadline = time.monotonic() + 30
        while len(got) < len(sent) and time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.1)
        assert got == [(body, "text/plain") for body in sent]
        connection.close()
        server.send_signal(signal.SIGINT)
        assert server.wait(30) == 0
        deadline = time.monotonic() + 10
        while any(os.path.exists(f"/proc/{pid}") for pid in shards) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(os.path.exists(f"/proc/{pid}") for pid in shards)
    finally:
        stop_process(server, 10)
