"""loadtest.cluster's pure parts and its plumbing around amqp-perf, with a fake amqp-perf
written by the test (a script that records its command line and prints a JSON line). The
RabbitMQ cluster itself is not started here: it takes half a minute of both cores."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from warren.loadtest import cluster

PUB = "amqp://guest:guest@127.0.0.1:5701/%2F"
CON = "amqp://guest:guest@127.0.0.1:5702/%2F"

RESULT = {"tool": "amqp-perf", "queues": 1, "consumers": 1, "queue_type": "classic",
          "body_size": 100, "window_s": 2.0, "published": 4000, "published_per_s": 2000.0,
          "consumed": 3000, "consumed_per_s": 1500.0, "e2e_p50_ms": 1.0, "e2e_p99_ms": 4.0,
          "broker_cpu_s": 0.2, "broker_cores_avg": 0.1, "other_cores_avg": 0.25,
          "left_in_queues_at_end": 0,
          "ok": True}

FAKE = """#!{python}
import json, os, sys
args = sys.argv[1:]
if args == ["-h"]:
    print("Usage of amqp-perf:\\n  -url string" + os.environ.get("FAKE_USAGE", ""),
          file=sys.stderr)
    sys.exit(2)
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps(args) + "\\n")
mode = os.environ.get("FAKE_MODE", "ok")
if mode == "crash":
    print("fake: cannot connect", file=sys.stderr)
    sys.exit(3)
if mode == "not-ok":
    print(json.dumps({{"tool": "amqp-perf", "ok": False, "error": "connection refused"}}))
    sys.exit(1)
result = dict(json.loads(os.environ["FAKE_RESULT"]))
result["scenario"] = args[args.index("--scenario") + 1]
print(json.dumps(result))
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    path = tmp_path / "amqp-perf"
    path.write_text(FAKE.format(python=sys.executable))
    path.chmod(0o755)
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("FAKE_RECORD", str(record))
    monkeypatch.setenv("FAKE_RESULT", json.dumps(RESULT))
    monkeypatch.delenv("FAKE_MODE", raising=False)
    monkeypatch.delenv("FAKE_USAGE", raising=False)

    def calls() -> list[list[str]]:
        if not record.exists():
            return []
        return [json.loads(line) for line in record.read_text().splitlines()]

    return SimpleNamespace(path=str(path), calls=calls)


def test_command_puts_the_consumers_on_their_own_node_and_names_every_broker_pid():
    argv = cluster.command("amqp-perf", PUB, CON, "persistent-confirm", 5, [11, 22, 33])
    assert argv == ["amqp-perf", "--url", PUB, "--consumer-url", CON, "--scenario",
                    "durable-confirm", "--seconds", "5", "--json", "--pid", "11,22,33"]


def test_command_on_one_node_has_no_consumer_url_and_keeps_a_rate():
    argv = cluster.command("amqp-perf", PUB, PUB, "fanout-4x4", 2.5, [], rate=1000)
    assert argv == ["amqp-perf", "--url", PUB, "--scenario", "fanout4", "--seconds", "2.5",
                    "--json", "--rate", "1000"]


def test_command_asks_for_the_queue_type_given():
    argv = cluster.command("amqp-perf", PUB, CON, "persistent-confirm", 5, [], queue_type="quorum")
    assert argv[-2:] == ["--queue-type", "quorum"]


def test_supports_consumer_url_reads_the_usage(fake, monkeypatch, tmp_path):
    assert not cluster.supports_consumer_url(fake.path)
    monkeypatch.setenv("FAKE_USAGE", "\n  -consumer-url string")
    assert cluster.supports_consumer_url(fake.path)
    assert not cluster.supports_consumer_url(str(tmp_path / "missing"))


@pytest.mark.parametrize("row, expected", [
    ({"broker_cpu_s": 0.2, "published": 4000, "consumed": 3000}, 50.0),
    ({"broker_cpu_s": 0.3, "published": 1000, "consumed": 3000}, 100.0),
    ({"broker_cpu_s": 0.1, "published": 1000, "consumed": None}, 100.0),
    ({"broker_cpu_s": None, "published": 1000, "consumed": 1000}, None),
    ({"broker_cpu_s": 0.1, "published": 0, "consumed": 0}, None),
])
def test_cpu_per_message_is_over_the_larger_count(row, expected):
    if expected is None:
        assert cluster.cpu_us_per_message(row) is None
    else:
        assert cluster.cpu_us_per_message(row) == pytest.approx(expected)


def test_measure_returns_the_bench_row_with_placement_and_cpu_per_message(fake):
    row = cluster.measure(fake.path, "transient-autoack", PUB, CON, [7, 8], 1,
                          broker="rabbitmq", placement="1->2")
    assert fake.calls() == [["--url", PUB, "--consumer-url", CON, "--scenario",
                             "transient-autoack", "--seconds", "1", "--json", "--pid", "7,8"]]
    assert row["status"] == "ok", row
    assert (row["scenario"], row["broker"], row["placement"]) == (
        "transient-autoack", "rabbitmq", "1->2")
    assert row["published_per_s"] == 2000.0 and row["consumed_per_s"] == 1500.0
    assert row["broker_cpu_us_per_msg"] == pytest.approx(50.0)
    assert row["other_cores_avg"] == 0.25


@pytest.mark.parametrize("mode, error", [("not-ok", "connection refused"),
                                         ("crash", "exit status 3")])
def test_measure_turns_a_failed_run_into_an_error_row(fake, monkeypatch, mode, error):
    monkeypatch.setenv("FAKE_MODE", mode)
    row = cluster.measure(fake.path, "fanout-4x4", PUB, CON, [], 1)
    assert row["status"] == "error" and error in row["error"]


def test_hop_cost_is_across_over_one_node_and_nothing_for_a_failed_run():
    cross = {"scenario": "s", "broker": "b", "status": "ok", "published_per_s": 500.0,
             "consumed_per_s": 400.0, "broker_cpu_us_per_msg": 30.0, "e2e_p99_ms": 2.0}
    local = dict(cross, published_per_s=1000.0, consumed_per_s=1000.0,
                 broker_cpu_us_per_msg=10.0, e2e_p99_ms=None)
    hop = cluster.hop_cost(cross, local)
    assert (hop["published_per_s"], hop["consumed_per_s"], hop["broker_cpu_us_per_msg"],
            hop["e2e_p99_ms"]) == (0.5, 0.4, 3.0, None)
    failed = cluster.hop_cost(cross, dict(local, status="error"))
    assert failed["published_per_s"] is None


def test_tables_have_a_line_per_row_with_its_figures():
    rows = [dict(RESULT, scenario="transient-autoack", broker="rabbitmq", placement=placement,
                 status="ok", broker_cpu_us_per_msg=50.0) for placement in ("1->2", "1->1")]
    rows.append(dict(scenario="fanout-4x4", broker="rabbitmq", placement="1->2",
                     status="error", error="exit status 3"))
    lines = cluster.format_rows(rows).splitlines()
    assert len(lines) == 2 + len(rows)
    assert lines[2].split() == ["transient-autoack", "rabbitmq", "classic", "1->2", "2,000",
                                "1,500",
                                "1.00", "4.00", "-", "0.10", "50.0", "0", "0.25", "ok"]
    assert lines[4].endswith("error: exit status 3")
    hop = cluster.hop_cost(rows[0], rows[1])
    assert cluster.format_hops([hop]).splitlines()[2].split() == [
        "transient-autoack", "rabbitmq", "1.00", "1.00", "1.00", "1.00"]


def test_node_env_gives_each_node_its_ports_and_the_cluster_its_epmd(tmp_path):
    base = {"PATH": os.environ.get("PATH", ""), "RABBITMQ_ALLOW_INPUT": "false"}
    env = cluster.node_env(base, tmp_path / "home", tmp_path / "n1", "n1@localhost", 5701,
                           25701, 4400)
    assert (env["RABBITMQ_NODE_PORT"], env["RABBITMQ_DIST_PORT"], env["ERL_EPMD_PORT"]) == (
        "5701", "25701", "4400")
    assert env["HOME"] == str(tmp_path / "home")  # the cookie all nodes share
    assert env["RABBITMQ_MNESIA_DIR"] == str(Path(tmp_path / "n1" / "mnesia" / "n1@localhost"))
    assert "RABBITMQ_ALLOW_INPUT" not in env
    assert "listeners.tcp.default = 127.0.0.1:5701\n" in cluster.node_config(5701)


def test_parse_args_takes_either_name_and_wants_as_many_dist_ports_as_ports():
    options = cluster.parse_args(["--external-client", "x", "--scenarios",
                                  "durable-confirm,fanout4", "--ports", "1,2,3",
                                  "--dist-ports", "4,5,6", "--epmd-port", "7"])
    assert options.scenarios == ["persistent-confirm", "fanout-4x4"]
    assert (options.ports, options.dist_ports, options.epmd_port) == ([1, 2, 3], [4, 5, 6], 7)
    with pytest.raises(SystemExit):
        cluster.parse_args(["--external-client", "x", "--ports", "1,2", "--dist-ports", "4"])
