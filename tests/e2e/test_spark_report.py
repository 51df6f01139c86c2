"""spark/report.py: the PySpark analysis of the shard statistics logs.

One local Spark session serves the whole module (the JVM takes seconds to start);
the report runs in-process against it. Needs Java and the `spark` extra.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

if shutil.which("java") is None:
    pytest.skip("PySpark needs a Java runtime and `java` is not on PATH",
                allow_module_level=True)
pytest.importorskip("pyspark", reason="pyspark is not installed (the `spark` extra)")
pytest.importorskip("matplotlib", reason="matplotlib is not installed (the `spark` extra)")

import pika  # noqa: E402

from warren.spark import logs, report, session, synth  # noqa: E402

from ..support.broker import RunningBroker, wait_until  # noqa: E402

TABLES = ("queue_rates", "shard_rates", "shard_balance", "top_backlog", "top_redeliveries",
          "confirm_latency", "fsync_batches", "consumer_timeouts", "bad_lines", "queue_totals")
CHARTS = ("throughput.png", "shard_balance.png", "confirm_latency.png", "fsync_batches.png")


pytestmark = [pytest.mark.slow, pytest.mark.run_once,  # its brokers choose their gateway processes
              pytest.mark.filterwarnings(
                  "ignore:PySpark does not yet fully support pandas:FutureWarning")]


@pytest.fixture(scope="module")
def spark_session():
    spark = session.build_session("local[2]", shuffle_partitions=2, short_run=True)
    yield spark
    spark.stop()


def by_name(summary: dict) -> dict:
    return {(q["vhost"], q["name"]): q for q in summary["queues"]}


def assert_outputs(out: Path) -> None:
    # What a person opens is at the top; Spark's part-files, _SUCCESS and .crc under data/.
    assert {p.name for p in out.iterdir()} == {*CHARTS, "summary.md", "summary.json", "data"}
    for table in TABLES:
        assert (out / "data" / table).is_dir(), table
        assert list((out / "data" / table).glob("*.parquet")), f"{table} has no Parquet file"
    for chart in CHARTS:
        assert (out / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", chart
    assert (out / "summary.md").is_file()
    # the parse stage is cleaned up
    assert {p.name for p in (out / "data").iterdir()} == set(TABLES)


# -- 1. end to end against a real broker ------------------------------------------------

def last_queue_stats(logs: Path) -> dict:
    """The newest queue_stats record per queue in the broker's logs (read directly)."""
    latest: dict = {}
    for path in sorted(logs.glob("shard-*.jsonl*")):
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line the writer has not finished
            if record.get("type") == "queue_stats":
                key = record["queue"]
                if key not in latest or record["ts"] >= latest[key]["ts"]:
                    latest[key] = record
    return latest


def placement(vhost: str, name: str, shards: int) -> int:
    from warren.gateway.values import placement as broker_placement

    return broker_placement(vhost, name, shards)


def queue_names_on_both_shards() -> list[str]:
    """Three queue names which the broker places on both of two shards."""
    candidates = [f"spark-q{n}" for n in range(100)]
    first = candidates[0]
    other = next(n for n in candidates if placement("/", n, 2) != placement("/", first, 2))
    third = next(n for n in candidates if n not in (first, other))
    return [first, other, third]


def test_end_to_end_report_of_a_real_broker(tmp_path, spark_session):
    data = tmp_path / "data"
    logs = data / "logs"
    busy, middle, idle = queue_names_on_both_shards()
    sent = {busy: 30, middle: 20, idle: 10}
    broker = RunningBroker(data, shards=2, extra_args=["--stats-interval", "0.2"]).start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        ch.confirm_delivery()
        for name, count in sent.items():
            ch.queue_declare(name)
            for i in range(count):
                ch.basic_publish("", name, f"{name}:{i}".encode())

        # busy: two messages rejected with requeue (so redelivered), then 12 acks
        held = [ch.basic_get(busy)[0] for _ in range(2)]
        for method in held:
            ch.basic_reject(method.delivery_tag, requeue=True)
        redelivered_seen = 0
        for _ in range(12):
            method, _, _ = ch.basic_get(busy)
            redelivered_seen += method.redelivered
            ch.basic_ack(method.delivery_tag)
        assert redelivered_seen == 2

        # middle: a consumer acks all 20
        got = []
        ch.basic_qos(prefetch_count=5)

        def on_message(channel, method, props, body):
            got.append(body)
            channel.basic_ack(method.delivery_tag)

        tag = ch.basic_consume(middle, on_message)
        wait_until(lambda: conn.process_data_events(0.05) or len(got) == 20, timeout=10,
                   message="consuming the middle queue")
        ch.basic_cancel(tag)
        conn.close()
        # idle: untouched (10 ready). The acks are asynchronous: wait until the shards
        # logged them, then stop cleanly (the final stats record is written on stop).
        expected_acked = {busy: 12, middle: 20, idle: 0}

        def acks_logged():
            latest = last_queue_stats(logs)
            return all(name in latest and latest[name]["acked"] == acked
                       for name, acked in expected_acked.items())

        wait_until(acks_logged, timeout=10, interval=0.1, message="acks in the stats log")
    finally:
        broker.stop()

    out = tmp_path / "report"
    summary = report.run([str(logs)], str(out), spark_session)

    queues = by_name(summary)
    for name, count in sent.items():
        q = queues[("/", name)]
        assert q["published"] == count, name
        assert q["acked"] == expected_acked[name], name
        assert q["shard"] == placement("/", name, 2)
    assert queues[("/", busy)]["redelivered"] >= 2
    assert queues[("/", busy)]["delivered"] == 14
    assert queues[("/", idle)]["peak_ready"] == 10
    assert summary["bad_lines"] == 0
    assert summary["records"] > 0

    shards = {s["shard"]: s for s in summary["shards"]}
    assert set(shards) == {0, 1}
    assert sum(s["published"] for s in shards.values()) == 60
    assert abs(sum(s["share_published"] for s in shards.values()) - 1.0) < 1e-9
    for s in shards.values():
        assert isinstance(s["published"], int) and isinstance(s["fsyncs"], int)

    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["records"] == summary["records"]
    assert {q["name"]: q["published"] for q in on_disk["queues"]} == sent
    markdown = (out / "summary.md").read_text()
    for name in sent:
        assert name in markdown
    assert "shard_balance.png" in markdown
    assert_outputs(out)
    rates = spark_session.read.parquet(str(out / "data" / "queue_rates"))
    assert {r["queue"] for r in rates.select("queue").distinct().collect()} == set(sent)


# -- 2 and 3. hand-written logs: bad lines, counter resets -----------------------------

def record(**fields) -> str:
    return json.dumps({"v": 1, **fields})


def queue_stats(ts, shard, name, published, delivered, acked, ready=0, **extra) -> str:
    counters = dict(published=published, published_bytes=published * 10, delivered=delivered,
                    redelivered=0, acked=acked, rejected=0, requeued=0, expired=0,
                    dead_lettered=0, timeouts=0)
    counters.update(extra)
    return record(type="queue_stats", ts=ts, shard=shard, vhost="/", queue=name,
                  queue_type="classic", **counters, ready=ready, unacked=0, consumers=1,
                  ram_bytes=0)


def shard_stats(ts, shard, fsyncs, messages, batch=None, latency=None) -> str:
    return record(type="shard_stats", ts=ts, shard=shard, fsyncs=fsyncs, messages=messages,
                  fsync_batch=batch or {}, confirm_latency_ms=latency or {})


BAD_LINES = [
    "this is not json",
    '{"v":1,"type":"queue_stats","ts":1.5,"shard":0,"vhost":"/","queue":"go',  # cut short
    "",                                                                        # blank
    "[1, 2, 3]",                                                               # not an object
    '{"v":1,"ts":2.0,"shard":0,"kind":"alarm"}',                               # no "type"
    '{"v":1,"type":"event","shard":0,"kind":"alarm"}',                         # no "ts"
    '{"v":99,"type":"queue_stats","ts":2.5,"shard":0,"vhost":"/","queue":"good",'
    '"published":1000}',                                                       # unknown v
    '{"v":1,"type":"event","ts":"yesterday","shard":0,"kind":"alarm"}',        # ts not a number
]
TRUNCATED_TAIL = '{"v":1,"type":"queue_stats","ts":3.0,"shard":0,"vhost":"/","que'


@pytest.fixture(scope="module")
def handmade(tmp_path_factory, spark_session):
    """One run over two hand-written logs: shard 0 mixes valid records with every kind
    of bad line and ends in a truncated write; shard 1 has counter resets."""
    logs = tmp_path_factory.mktemp("handmade") / "logs"
    logs.mkdir()
    shard0 = [
        record(type="event", ts=0.5, shard=0, kind="shard_started"),
        record(type="event", ts=0.6, shard=0, kind="queue_declared", vhost="/", queue="good",
               durable=True, something_new={"nested": [1, 2]}),
        BAD_LINES[0],
        queue_stats(1.0, 0, "good", 5, 4, 3, ready=1),
        BAD_LINES[1],
        shard_stats(1.0, 0, 2, 5, {"1": 1, "4": 1}, {"p50": 1.5, "p90": 2.0, "p99": 3.0,
                                                      "max": 4.0}),
        *BAD_LINES[2:5],
        queue_stats(2.0, 0, "good", 9, 9, 9),
        shard_stats(2.0, 0, 3, 9, {"4": 1}),
        *BAD_LINES[5:],
        record(type="event", ts=2.1, shard=0, kind="consumer_timed_out", vhost="/",
               queue="good"),
    ]
    (logs / "shard-0.jsonl").write_text("\n".join(shard0) + "\n" + TRUNCATED_TAIL)
    shard1 = [
        # "drops": a counter decrease is a reset (no event about it in the log)
        queue_stats(10.0, 1, "drops", 40, 40, 35, ready=5),
        queue_stats(11.0, 1, "drops", 100, 90, 80, ready=12),
        queue_stats(12.0, 1, "drops", 7, 5, 5, ready=2),
        queue_stats(13.0, 1, "drops", 20, 18, 18, ready=2),
        # "restarted": the shard restarts at 11.5 and the new count passes the old one
        queue_stats(10.0, 1, "restarted", 5, 5, 5),
        queue_stats(11.0, 1, "restarted", 10, 10, 10),
        record(type="event", ts=11.5, shard=1, kind="shard_started"),
        queue_stats(12.0, 1, "restarted", 50, 50, 50),
        shard_stats(11.0, 1, 10, 100),
        shard_stats(12.0, 1, 3, 30),
    ]
    (logs / "shard-1.jsonl").write_text("\n".join(shard1) + "\n")
    out = logs.parent / "report"
    summary = report.run([str(logs)], str(out), spark_session)
    return summary, out, spark_session


def test_bad_and_truncated_lines_are_counted_exactly(handmade):
    summary, out, spark_session = handmade
    expected_bad = len(BAD_LINES) + 1  # + the truncated last line
    assert summary["bad_lines"] == expected_bad
    files = {Path(logs.short_path(f["file"])).name: f for f in summary["files"]}
    assert files["shard-0.jsonl"]["bad_lines"] == expected_bad
    assert files["shard-0.jsonl"]["records"] == 7
    assert files["shard-1.jsonl"]["bad_lines"] == 0
    assert summary["bad_lines_by_reason"] == {"malformed": 6, "missing_field": 2,
                                              "unknown_version": 1}
    assert summary["records"] == 7 + 10
    assert spark_session.read.parquet(str(out / "data" / "bad_lines")).count() == expected_bad

    good = by_name(summary)[("/", "good")]
    assert (good["published"], good["delivered"], good["acked"]) == (9, 9, 9)
    assert good["peak_ready"] == 1
    shard0 = next(s for s in summary["shards"] if s["shard"] == 0)
    assert (shard0["fsyncs"], shard0["messages"]) == (3, 9)
    assert {h["bucket"]: h["fsyncs"] for h in summary["fsync_batches"]} == {1: 1, 4: 2}
    assert summary["consumer_timeouts"] == [
        {"vhost": "/", "queue": "good", "shard": 0, "timeouts_counter": 0,
         "timeout_events": 1}]
    latency = {c["shard"]: c for c in summary["confirm_latency"]}
    assert latency[0]["max_ms"] == 4.0 and latency[0]["intervals"] == 1
    markdown = (out / "summary.md").read_text()
    assert "9 bad lines" in markdown
    assert_outputs(out)


def test_counter_resets_sum_the_segments(handmade):
    summary, _, _ = handmade
    queues = by_name(summary)
    drops = queues[("/", "drops")]
    assert (drops["published"], drops["delivered"], drops["acked"]) == (120, 108, 98)
    assert drops["segments"] == 2
    assert drops["peak_ready"] == 12 and drops["final_ready"] == 2
    restarted = queues[("/", "restarted")]
    assert restarted["published"] == 60  # 10 before the restart + 50 after
    assert restarted["segments"] == 2
    shard1 = next(s for s in summary["shards"] if s["shard"] == 1)
    assert (shard1["fsyncs"], shard1["messages"]) == (13, 130)
    assert shard1["published"] == 180
    top = summary["top_backlog"][0]
    assert (top["queue"], top["peak_ready"]) == ("drops", 12)


# -- 4. synthetic logs through the command line as a person runs it: quiet, unless --verbose --

SPARK_NOISE = ("Using Spark's default log4j profile", "NativeCodeLoader", " WARN ",
               "WARNING: Using incubator modules", "Setting default log level")


def test_the_command_is_quiet_unless_verbose(tmp_path):
    logs = tmp_path / "synth"
    manifest = synth.generate(str(logs), records=2000, shards=2, queues=20, interval=1.0,
                              bad=3, restarts=1)
    assert manifest["records"] == 2000
    assert len(list(logs.glob("shard-*.jsonl*"))) == 2

    def report_command(inputs: Path, out: str, *extra) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "warren.spark.report", str(inputs), "--out",
             str(tmp_path / out), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)

    def finished(command: subprocess.Popen) -> subprocess.CompletedProcess:
        stdout, stderr = command.communicate(timeout=300)
        return subprocess.CompletedProcess(command.args, command.returncode, stdout, stderr)

    # Both at once. Spark logs as it starts, so the verbose run needs no report: it is
    # given no input and stops once Spark is up (a second whole report took half
    # this test's time on a 2-core machine).
    quiet_run = report_command(logs / "shard-*.jsonl*", "report", "--top", "5")
    verbose_run = report_command(tmp_path / "no-such-logs", "verbose", "--verbose")
    quiet, verbose = finished(quiet_run), finished(verbose_run)
    assert quiet.returncode == 0, quiet.stderr
    assert "2,000 records, 3 bad lines" in quiet.stdout
    # progress on stderr, one line per stage with the time since the start
    stages = [line for line in quiet.stderr.splitlines() if line.strip()]
    assert stages and all(re.match(r"\[ *[0-9.]+ s\] ", line) for line in stages), quiet.stderr
    assert re.search(r"^\[ *[0-9.]+ s\] reading logs\.\.\. 2 files", quiet.stderr, re.M)
    assert "computing latency percentiles" in quiet.stderr
    for noise in SPARK_NOISE:
        assert noise not in quiet.stderr
    out = tmp_path / "report"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["records"] == 2000
    assert summary["bad_lines"] == 3
    assert summary["records_by_type"] == manifest["records_by_type"]
    queues = by_name(summary)
    assert len(queues) == 20
    for expected in manifest["queues"]:
        q = queues[(expected["vhost"], expected["name"])]
        for field in ("shard", "published", "delivered", "acked", "redelivered", "timeouts",
                      "peak_ready"):
            assert q[field] == expected[field], (expected["name"], field)
    assert {s["shard"] for s in summary["shards"]} == {0, 1}
    assert len(summary["top_backlog"]) <= 5
    assert_outputs(out)

    assert verbose.returncode == 2, verbose.stderr
    assert "error: no input matches" in verbose.stderr
    assert "Using Spark's default log4j profile" in verbose.stderr
