"""`warren bench --external-client PATH`: the plumbing, with a fake external client written
by the test (a script that records its command line and prints a JSON line), and one short
real run of amqp-perf when it is installed at /opt/amqp-perf/amqp-perf (skipped otherwise;
the project does not ship it). No timing assertions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from warren.loadtest import bench, external, output, procs, targets

ROOT = Path(__file__).resolve().parents[2]

AMQP_PERF = Path("/opt/amqp-perf/amqp-perf")

# What amqp-perf prints for a flow scenario (trimmed to the keys the bench reads).
FLOW_RESULT = {
    "tool": "amqp-perf", "scenario": "durable-confirm", "queues": 1, "consumers": 1,
    "queue_type": "classic", "body_size": 100, "confirm_window": 1000, "window_s": 1.0,
    "published": 1000, "published_per_s": 1000.0, "confirmed": 1000, "confirmed_per_s": 1000.0,
    "nacked": 0, "consumed": 500, "consumed_per_s": 500.0, "e2e_p50_ms": 1.5,
    "e2e_p99_ms": 9.5, "confirm_p50_ms": 2.5, "confirm_p99_ms": 7.5,
    "left_in_queues_at_end": 500, "client_cpu_s": 0.25, "broker_cpu_s": 0.8,
    "broker_cores_avg": 0.8, "broker_end_rss_mb": 120.0, "broker_end_pss_mb": 80.0,
    "client_writes_per_s": 900.0, "ok": True,
}

FAKE = """#!{python}
import json, os, sys
args = sys.argv[1:]
pid = args[args.index("--pid") + 1] if "--pid" in args else None
cmdline = ""
if pid:
    with open(f"/proc/{{pid}}/cmdline", "rb") as f:
        cmdline = f.read().replace(b"\\0", b" ").decode()
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps({{"argv": args, "pid_cmdline": cmdline}}) + "\\n")
mode = os.environ.get("FAKE_MODE", "ok")
if mode == "crash":
    print("fake: cannot connect", file=sys.stderr)
    sys.exit(3)
if mode == "not-ok":
    print(json.dumps({{"tool": "amqp-perf", "ok": False, "error": "connection refused"}}))
    sys.exit(1)
result = dict(json.loads(os.environ["FAKE_RESULT"]))
result["scenario"] = args[args.index("--scenario") + 1]
print("warming up")
print(json.dumps(result))
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    path = tmp_path / "amqp-perf"
    path.write_text(FAKE.format(python=sys.executable))
    path.chmod(0o755)
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("FAKE_RECORD", str(record))
    monkeypatch.setenv("FAKE_RESULT", json.dumps(FLOW_RESULT))
    monkeypatch.delenv("FAKE_MODE", raising=False)

    def calls() -> list[dict]:
        if not record.exists():
            return []
        return [json.loads(line) for line in record.read_text().splitlines()]

    return SimpleNamespace(path=str(path), calls=calls)


def _target(pid=None):
    return SimpleNamespace(url="amqp://guest:guest@127.0.0.1:1/%2F", label="warren",
                           root_pid=lambda: pid)


def _options(**extra):
    return SimpleNamespace(**dict(dict(duration=1.5, rate=0.0, backlog=2000), **extra))


def test_command_line_and_row(fake):
    row = external.run(fake.path, _target(pid=os.getpid()), "persistent-confirm",
                       _options(rate=250.0), queue_type="quorum")
    [call] = fake.calls()
    assert call["argv"] == ["--url", "amqp://guest:guest@127.0.0.1:1/%2F",
                            "--scenario", "durable-confirm", "--seconds", "1.5", "--json",
                            "--rate", "250", "--pid", str(os.getpid()),
                            "--queue-type", "quorum"]
    assert row["status"] == "ok", row
    assert row["client"] == "amqp-perf" and row["client_scenario"] == "durable-confirm"
    assert row["scenario"] == "persistent-confirm" and row["broker"] == "warren"
    assert row["published_per_s"] == 1000.0 and row["confirmed_per_s"] == 1000.0
    assert row["consumed_per_s"] == row["delivered_per_s"] == 500.0
    assert row["consumed_over_published"] == 0.5
    assert row["e2e_p99_ms"] == 9.5 and row["broker_cores_avg"] == 0.8
    assert row["broker_rss_mb"] == 120.0 and row["client_cpu_s"] == 0.25
    assert row["client_writes_per_s"] == 900.0  # the load the rate offered, per broker
    assert row["note"] == "500 left in queues"
    assert row["external"]["tool"] == "amqp-perf"
    table = output.format_table([row])
    assert "durable-confirm" in table and "amqp-perf" in table and "0.50" in table
    assert "cli wr/s" in table and " 900 " in table


def test_backlog_row_and_no_pid(fake, monkeypatch):
    monkeypatch.setenv("FAKE_RESULT", json.dumps({
        "tool": "amqp-perf", "published": 2000, "confirmed": 2000, "nacked": 0,
        "publish_s": 0.5, "publish_per_s": 4000.0, "drained": 2000, "drain_s": 0.5,
        "drain_per_s": 4000.0, "publish_broker_cpu_s": 0.25, "drain_broker_cpu_s": 0.25,
        "broker_after_publish_rss_mb": 150.0, "broker_after_publish_pss_mb": 100.0,
        "client_cpu_s_total": 0.1, "ok": True}))
    row = external.run(fake.path, _target(), "backlog-200k", _options(rate=100.0))
    [call] = fake.calls()
    # No --pid when the broker's is not known, no --rate for the backlog, its --count.
    assert call["argv"] == ["--url", "amqp://guest:guest@127.0.0.1:1/%2F", "--scenario",
                            "backlog", "--seconds", "1.5", "--json", "--count", "2000"]
    assert row["status"] == "ok", row
    assert row["published_per_s"] == 4000.0 and row["drain_per_s"] == 4000.0
    assert row["consumed_over_published"] is None
    assert row["backlog_rss_mb"] == 150.0 and row["broker_cores_avg"] == 0.5


@pytest.mark.parametrize("mode,expected", [("crash", "exit status 3, no JSON line: fake: "
                                                     "cannot connect"),
                                           ("not-ok", "exit status 1: connection refused")])
def test_failed_run_is_an_error_row(fake, monkeypatch, mode, expected):
    monkeypatch.setenv("FAKE_MODE", mode)
    row = external.run(fake.path, _target(), "transient-autoack", _options())
    assert row["status"] == "error" and row["error"] == expected, row
    assert "error: exit status" in output.format_table([row])


def test_missing_executable_is_an_error_row(tmp_path):
    row = external.run(str(tmp_path / "gone"), _target(), "transient-autoack", _options())
    assert row["status"] == "error" and "cannot run" in row["error"], row


def test_scenario_names_and_client_arguments(fake):
    options = bench.parse_args(["--scenarios", "durable-confirm,fanout4,transient-ack",
                                "--external-client", fake.path])
    assert options.scenario_list == ["persistent-confirm", "fanout-4x4", "transient-ack"]
    assert options.clients == ["amqp-perf"] and options.fresh_warren
    options = bench.parse_args(["--external-client", fake.path, "--client", "both",
                                "--no-fresh-warren"])
    assert options.clients == ["warren-bench", "amqp-perf"] and not options.fresh_warren
    assert bench.parse_args([]).clients == ["warren-bench"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--client", "both"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--external-client", str(Path(fake.path).parent / "missing")])


def test_a_scenario_at_its_own_rate(fake):
    options = bench.parse_args(["--external-client", fake.path, "--rate", "50", "--scenarios",
                                "transient-autoack,transient-autoack@10000,transient-manual@2.5e3,"
                                "latency-1,transient-autoack@1e4"])
    assert options.scenario_list == ["transient-autoack", "transient-autoack@10000",
                                     "transient-ack@2500", "confirm-each"]
    assert options.runs == {"transient-autoack": ("transient-autoack", 50.0),
                            "transient-autoack@10000": ("transient-autoack", 10000.0),
                            "transient-ack@2500": ("transient-ack", 2500.0),
                            "confirm-each": ("confirm-each", 50.0)}
    for wrong in ["transient-autoack@", "transient-autoack@0", "transient-autoack@-5",
                  "transient-autoack@fast", "transient-autoack@inf", "transient-autoack@nan",
                  "backlog@1000", "nothing@1000"]:
        with pytest.raises(SystemExit):
            bench.parse_args(["--external-client", fake.path, "--scenarios", wrong])


def test_compare_without_rabbitmq_installs_nothing(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(targets, "RABBIT_SERVER", tmp_path / "no-rabbitmq-server")

    def refuse(*args, **kwargs):
        raise AssertionError(f"ran {args}")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    assert bench.main(["--compare", "--quick", "--scenarios", "transient-autoack"]) == 2
    assert "apt-get install rabbitmq-server" in capsys.readouterr().err


def _bench(args: list[str], timeout: float = 120) -> tuple[subprocess.CompletedProcess, list]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-m", "warren.loadtest.bench", *args], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=timeout)
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return result, [row for row in rows if row.get("type") == "scenario"]


def test_cli_failed_external_runs_are_reported(fake, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "crash")
    port = procs.free_port()  # nothing listens there: no --pid, and the fake never connects
    result, rows = _bench(["--url", f"amqp://guest:guest@127.0.0.1:{port}/%2F",
                           "--external-client", fake.path, "--scenarios",
                           "transient-manual,backlog", "--duration", "1"])
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert [(r["client_scenario"], r["status"]) for r in rows] == [
        ("transient-manual", "error"), ("backlog", "error")], rows
    assert "error: exit status 3, no JSON line: fake: cannot connect" in result.stdout
    assert [c["argv"][3] for c in fake.calls()] == ["transient-manual", "backlog"]


def test_cli_a_flood_and_a_rate_of_one_scenario_in_one_run(fake):
    port = procs.free_port()  # the fake answers without connecting
    result, rows = _bench(["--url", f"amqp://guest:guest@127.0.0.1:{port}/%2F",
                           "--external-client", fake.path, "--scenarios",
                           "transient-autoack,transient-autoack@250", "--duration", "1"])
    assert result.returncode == 0, result.stdout + result.stderr
    flood, steady = fake.calls()
    assert "--rate" not in flood["argv"], flood
    assert steady["argv"][steady["argv"].index("--rate") + 1] == "250", steady
    assert [(r["scenario"], r["rate"], r["client_scenario"]) for r in rows] == [
        ("transient-autoack", 0.0, "transient-autoack"),
        ("transient-autoack@250", 250.0, "transient-autoack")], rows
    table = result.stdout[result.stdout.index("\nscenario"):]
    assert "transient-autoack@250" in table, table


def test_cli_both_clients_on_a_fresh_warren(fake):
    result, rows = _bench(["--warren", "--shards", "1", "--quick", "--client", "both",
                           "--external-client", fake.path, "--scenarios", "persistent-confirm"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert [(r["client"], r["client_scenario"]) for r in rows] == [
        ("warren-bench", "persistent-confirm"), ("amqp-perf", "durable-confirm")], rows
    own, theirs = rows
    assert own["status"] == theirs["status"] == "ok", rows
    assert own["consumed_per_s"] and own["consumed_over_published"] is not None, own
    assert theirs["consumed_over_published"] == 0.5, theirs
    [call] = fake.calls()
    # The external client got the private Warren's URL and its root pid.
    assert call["argv"][1].startswith("amqp://guest:guest@127.0.0.1:"), call
    assert "warren.gateway.cli.main serve" in call["pid_cmdline"], call
    table = result.stdout[result.stdout.index("\nscenario"):]
    assert "warren-bench" in table and "amqp-perf" in table and "cons/pub" in table


@pytest.mark.skipif(not AMQP_PERF.exists(),
                    reason=f"{AMQP_PERF} is not installed (build amqp-perf from its README)")
def test_amqp_perf_against_a_private_warren():
    result, rows = _bench(["--warren", "--shards", "2", "--external-client", str(AMQP_PERF),
                           "--scenarios", "transient-autoack", "--duration", "1"], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    [row] = rows
    assert row["client"] == "amqp-perf" and row["status"] == "ok", row
    assert row["published"] > 0 and row["external"]["ok"] is True, row
    assert "--pid" in row["command"], row


def test_rabbitmq_queue_type_compared_is_the_one_that_sustains_more():
    # Quorum confirmed more but delivered a third of it: classic sustains more.
    classic = {"status": "ok", "queue_type": "classic", "confirmed_per_s": 30_834,
               "consumed_per_s": 30_805}
    quorum = {"status": "ok", "queue_type": "quorum", "confirmed_per_s": 50_109,
              "consumed_per_s": 17_119}
    assert bench.best_rabbit([classic, quorum]) is classic
    assert bench.best_rabbit([{**classic, "status": "error"}, quorum]) is quorum
    no_consumer = {"status": "ok", "confirmed_per_s": 2_000}  # latency-1: confirms only
    assert bench.best_rabbit([no_consumer, {**no_consumer, "confirmed_per_s": 1_000}]) \
        is no_consumer


def test_comparison_shows_the_load_each_broker_was_offered():
    # At one rate, the client wrote more often to one broker than to the other: the
    # comparison says so beside the CPU it cost.
    warren = {"status": "ok", "scenario": "transient-autoack@10000", "client": "amqp-perf",
              "broker_cores_avg": 0.8, "client_writes_per_s": 8_400.0}
    rabbit = {"status": "ok", "scenario": "transient-autoack@10000", "client": "amqp-perf",
              "broker_cores_avg": 0.4, "client_writes_per_s": 2_100.0}
    compared = output.comparison(warren, rabbit)
    assert compared["warren_over_rabbitmq"]["client_writes_per_s"] == 4.0
    assert compared["warren_over_rabbitmq"]["broker_cores_avg"] == 2.0
    line = next(line for line in output.format_comparison([(warren, rabbit)]).splitlines()
                if "client writes/s" in line)
    assert "8,400" in line and "2,100" in line and "4.00" in line


def test_repeated_rounds_alternate_the_brokers(fake, monkeypatch, capsys):
    # --compare --repeat 3 with stand-in brokers: each round has both, the one that goes
    # first alternates, and the summary gives each round and the median of the rounds.
    def stand_in(label, port):
        return lambda *args: SimpleNamespace(
            label=label, url=f"amqp://guest:guest@127.0.0.1:{port}/%2F",
            root_pid=lambda: None, stop=lambda: None)

    monkeypatch.setattr(bench, "rabbitmq_missing", lambda: None)
    monkeypatch.setattr(bench, "RabbitTarget", stand_in("rabbitmq", 1))
    monkeypatch.setattr(bench, "WarrenTarget", stand_in("warren", 2))
    assert bench.main(["--compare", "--external-client", fake.path, "--repeat", "3",
                       "--scenarios", "transient-autoack,transient-autoack@10000",
                       "--duration", "1"]) == 0
    ports = [call["argv"][1].split(":")[3].split("/")[0] for call in fake.calls()]
    assert ports == ["1", "2", "2", "1", "1", "2",  # the flood: rounds 1, 2, 3
                     "2", "1", "1", "2", "2", "1"], ports  # the rate: the other way round
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    scenario_rows = [row for row in rows if row.get("type") == "scenario"]
    assert [row["round"] for row in scenario_rows] == [1, 1, 2, 2, 3, 3] * 2
    summary = out[out.rindex("\nscenario"):]
    for round_ in (1, 2, 3):
        assert f"transient-autoack@10000 #{round_}" in summary, summary
    assert "transient-autoack@10000 median" in summary and "3 of 3 rounds ok" in summary
    with pytest.raises(SystemExit):
        bench.parse_args(["--compare", "--repeat", "0"])


def test_the_median_of_the_rounds():
    def pair(round_, warren_cores, rabbit_cores, status="ok"):
        common = {"scenario": "transient-autoack@10000", "client": "amqp-perf",
                  "round": round_, "published_per_s": 10_000, "consumed_per_s": 10_000}
        return ({**common, "status": status, "broker_cores_avg": warren_cores},
                {**common, "status": "ok", "broker_cores_avg": rabbit_cores})

    pairs = [pair(1, 0.8, 0.5), pair(2, 0.5, 0.5), pair(3, 0.6, 0.5),
             pair(4, 0.1, 0.5, status="error")]  # a failed round counts in no median
    lines = output.format_ratios(pairs).splitlines()
    median = next(line for line in lines if "median" in line)
    # scenario, client, W/R pub/s, cons/s, CPU (the median of 1.6, 1.0 and 1.2)
    assert median.split()[1:6] == ["median", "amqp-perf", "1.00", "1.00", "1.20"], lines
    assert median.endswith("3 of 4 rounds ok"), median
    assert [line.split()[1] for line in lines[2:6]] == ["#1", "#2", "#3", "#4"], lines
