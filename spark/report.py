"""Analyse Warren's shard statistics logs (schema v1, see shards/stats.py) with PySpark.

    python -m warren.spark.report DATA/logs --out report/
    spark-submit spark/report.py --master spark://host:7077 hdfs:///warren/logs --out report/

Inputs may be directories (their ``shard-*.jsonl*`` files are read), globs or files,
as local paths or any Hadoop-compatible URI (file://, hdfs://, s3a://...). Lines are
read with ``spark.read.text`` and parsed with ``from_json`` against an explicit
schema; lines that are not JSON objects, lack v/type/ts/shard or carry an unknown
schema version are counted and reported as bad lines, never fatal.

Everything is computed with the DataFrame API; only small aggregated results
(per-queue and per-shard totals, bucketed chart series) reach the driver. The lines are
parsed once: a small input (under SMALL_INPUT_BYTES) into memory, a large one into a
Parquet staging table under DIR/data (removed at the end), so later passes read only
the columns they need and nothing has to fit in memory. DIR gets:

* summary.md (read this first) and summary.json;
* PNG charts: throughput.png, shard_balance.png, confirm_latency.png, fsync_batches.png;
* under data/, Parquet tables: queue_rates, queue_totals, shard_rates, shard_balance,
  top_backlog, top_redeliveries, confirm_latency, fsync_batches, consumer_timeouts,
  bad_lines.

Progress goes to stderr, one line per stage; Spark's own log is quiet unless --verbose.

Counters are cumulative in the logs; totals are reset-aware (see spark/tables.py).

spark-submit runs this file as a script: the driver's Python needs Warren installed
(`pip install -e .`) for the modules beside it to import.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
import time
import warnings

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from warren.spark.charts import (
    CHARTS,
    balance_chart,
    chart_series,
    fsync_chart,
    latency_chart,
    throughput_chart,
)
from warren.spark.logs import (
    COUNTERS,
    DEFAULT_PATTERN,
    iso_time,
    local_input_bytes,
    parse_records,
    read_lines,
    resolve_inputs,
    short_path,
    total_bytes,
)
from warren.spark.output import Output
from warren.spark.session import build_session
from warren.spark.summary import render_json, render_markdown
from warren.spark.tables import (
    TABLES,
    bad_lines,
    confirm_latency,
    consumer_timeouts,
    events_of,
    fsync_batches,
    queue_deltas,
    queue_rates,
    queue_totals,
    shard_balance,
    shard_deltas,
    shard_rates,
    top_backlog,
    top_redeliveries,
)

SMALL_INPUT_BYTES = 32 << 20   # below this: parse into memory, no whole-stage codegen,
                               # a C1-only JVM and one shuffle partition
SMALL_SHUFFLE_PARTITIONS = 1   # a few thousand rows: one task per stage is quickest
SHUFFLE_PARTITIONS = 4


# -- the run ------------------------------------------------------------------------------

class Progress:
    """Stage lines on a stream (stderr) with the time since the start, e.g.
    "[  12.3 s] computing latency percentiles..."; silent without a stream."""

    def __init__(self, stream=None):
        self.stream = stream
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        if self.stream is not None:
            print(f"[{time.monotonic() - self.started:6.1f} s] {message}", file=self.stream,
                  flush=True)


def run(inputs: list[str], out: str, spark: SparkSession | None = None, top: int = 10,
        max_queue_rows: int = 100, pattern: str = DEFAULT_PATTERN,
        progress: Progress | None = None) -> dict:
    """Analyse the logs in `inputs` into `out`; returns the summary (as summary.json)."""
    started = time.monotonic()
    progress = progress or Progress()
    spark = spark or build_session()
    files = resolve_inputs(spark, inputs, pattern)
    size = total_bytes(spark, files)
    progress(f"reading logs... {len(files)} files, {size / 1e6:,.1f} MB")
    output = Output(spark, out)

    small = size < SMALL_INPUT_BYTES
    codegen = spark.conf.get("spark.sql.codegen.wholeStage")
    progress("parsing lines...")
    records = parse_records(read_lines(spark, files))
    try:
        if small:
            # Compiling whole-stage code for each of the report's queries costs more
            # than it saves, and the parsed lines fit in memory.
            spark.conf.set("spark.sql.codegen.wholeStage", "false")
            parsed = records.persist(StorageLevel.MEMORY_AND_DISK)
        else:
            # Parse once into a staging table: later passes read only the columns they
            # need, and nothing has to fit in memory.
            staging = output.table("staging_records")
            records.write.mode("overwrite").parquet(staging)
            parsed = spark.read.parquet(staging)
        summary = _analyse(spark, output, files, parsed, top, max_queue_rows, progress)
    finally:
        if small:
            records.unpersist()
            spark.conf.set("spark.sql.codegen.wholeStage", codegen)
        else:
            output.delete("staging_records")
    summary["elapsed_seconds"] = round(time.monotonic() - started, 3)
    progress("writing summary.md...")
    output.write_bytes("summary.json", render_json(summary).encode())
    output.write_bytes("summary.md", render_markdown(summary, max_queue_rows).encode())
    return summary


def _analyse(spark, output: Output, files: list[str], parsed: DataFrame, top: int,
             max_queue_rows: int, progress: Progress) -> dict:
    progress("counting records and bad lines...")
    # One pass over the lines (this also fills the cache): counts per file, status, type.
    counts = (parsed.groupBy("file", "status", "type", "kind")
              .agg(F.count(F.lit(1)).alias("n"), F.min("ts").alias("t0"),
                   F.max("ts").alias("t1")).collect())
    per_file = {f: {"file": f, "lines": 0, "records": 0, "bad_lines": 0} for f in files}
    by_type: dict[str, int] = {}
    by_kind: dict[str, int] = {}
    by_reason: dict[str, int] = {}
    t0 = t1 = None
    for row in counts:
        entry = per_file.setdefault(_match_file(row["file"], per_file),
                                    {"file": row["file"], "lines": 0, "records": 0,
                                     "bad_lines": 0})
        entry["lines"] += row["n"]
        if row["status"] == "ok":
            entry["records"] += row["n"]
            by_type[row["type"]] = by_type.get(row["type"], 0) + row["n"]
            if row["type"] == "event":
                kind = row["kind"] or "(none)"
                by_kind[kind] = by_kind.get(kind, 0) + row["n"]
            t0 = row["t0"] if t0 is None else min(t0, row["t0"])
            t1 = row["t1"] if t1 is None else max(t1, row["t1"])
        else:
            entry["bad_lines"] += row["n"]
            by_reason[row["status"]] = by_reason.get(row["status"], 0) + row["n"]

    valid = parsed.filter(F.col("status") == "ok").drop("status", "line")
    events = events_of(valid)

    bad = output.write_table(bad_lines(parsed), "bad_lines", sort=["file", "reason"])
    examples = [r.asDict() for r in bad.select(
        "file", "reason", F.substring("line", 1, 200).alias("line")).limit(5).collect()
    ] if by_reason else []

    progress("computing queue rates and totals...")
    # queue_rates holds every increment: the per-queue and per-shard tables build on it.
    rates = output.write_table(queue_rates(queue_deltas(valid, events)), "queue_rates",
                               small=False)
    sd = shard_deltas(valid, events).persist(StorageLevel.MEMORY_AND_DISK)  # one row a tick
    totals = output.write_table(queue_totals(rates), "queue_totals", sort=["vhost", "queue"])
    progress("computing shard rates and balance...")
    srates = output.write_table(shard_rates(rates, sd), "shard_rates", sort=["shard", "ts"])
    balance = output.write_table(shard_balance(valid, totals, sd), "shard_balance",
                                 sort=["shard"])
    sd.unpersist()
    backlog = output.write_table(top_backlog(totals, top), "top_backlog")
    redeliveries = output.write_table(top_redeliveries(totals, top), "top_redeliveries")
    progress("computing latency percentiles, fsync batches and consumer timeouts...")
    latency = output.write_table(confirm_latency(valid), "confirm_latency", sort=["shard", "ts"])
    fsyncs = output.write_table(fsync_batches(valid), "fsync_batches", sort=["bucket"])
    timeouts = output.write_table(consumer_timeouts(totals, events), "consumer_timeouts",
                                  sort=[F.desc("timeouts_counter"), F.desc("timeout_events"),
                                        "vhost", "queue"])

    queues = [{"vhost": r["vhost"], "name": r["queue"], "shard": r["shard"],
               "queue_type": r["queue_type"],
               **{c: r[c] for c in COUNTERS},
               "peak_ready": r["peak_ready"], "final_ready": r["final_ready"],
               "final_unacked": r["final_unacked"], "segments": r["segments"],
               "samples": r["samples"]}
              for r in totals.collect()]
    queues.sort(key=lambda q: (q["vhost"], q["name"]))
    shards = sorted((r.asDict() for r in balance.collect()), key=lambda r: r["shard"])
    latency_rows = [r.asDict() for r in _latency_summary(latency).collect()]
    latency_rows.sort(key=lambda r: (r["shard"] is None, r["shard"] or 0))

    progress("drawing charts...")
    t0f = t0 if t0 is not None else 0.0
    t1f = t1 if t1 is not None else t0f
    timed = srates.filter(F.col("interval_s").isNotNull())
    throughput = chart_series(timed, t0f, t1f, {
        "published_per_s": F.try_divide(F.sum("published"), F.sum("interval_s")),
        "delivered_per_s": F.try_divide(F.sum("delivered"), F.sum("interval_s"))})
    lat_series = chart_series(latency, t0f, t1f, {"p50_ms": F.avg("p50_ms"),
                                                 "p99_ms": F.max("p99_ms")})
    hist = sorted((r.asDict() for r in fsyncs.collect()), key=lambda h: h["bucket"])
    output.write_bytes(CHARTS["throughput"], throughput_chart(throughput, t0f))
    output.write_bytes(CHARTS["shard_balance"], balance_chart(shards))
    output.write_bytes(CHARTS["confirm_latency"], latency_chart(lat_series, t0f))
    output.write_bytes(CHARTS["fsync_batches"], fsync_chart(hist))

    return {
        "report_version": 1,
        "generated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "spark_version": spark.version,
        "inputs": files,
        "files": sorted(per_file.values(), key=lambda f: f["file"]),
        "records": sum(by_type.values()),
        "bad_lines": sum(by_reason.values()),
        "bad_lines_by_reason": by_reason,
        "bad_line_examples": examples,
        "records_by_type": by_type,
        "events_by_kind": by_kind,
        "time_span": {"start": t0, "end": t1,
                      "seconds": (t1 - t0) if t0 is not None else 0.0,
                      "start_iso": iso_time(t0) if t0 is not None else None,
                      "end_iso": iso_time(t1) if t1 is not None else None},
        "queues": queues,
        "shards": shards,
        "top_backlog": sorted((_without("peak_ready_time", r) for r in backlog.collect()),
                              key=lambda q: (-q["peak_ready"], q["vhost"], q["queue"])),
        "top_redeliveries": sorted((r.asDict() for r in redeliveries.collect()),
                                   key=lambda q: (-q["redelivered"], q["vhost"], q["queue"])),
        "confirm_latency": latency_rows,
        "fsync_batches": hist,
        "consumer_timeouts": sorted((r.asDict() for r in timeouts.collect()), key=lambda c: (
            -c["timeouts_counter"], -c["timeout_events"], c["vhost"], c["queue"])),
        "tables": {t: output.table(t) for t in TABLES},
        "charts": dict(CHARTS),
    }


def _without(column: str, row) -> dict:
    d = row.asDict()
    d.pop(column, None)
    return d


def _latency_summary(latency: DataFrame) -> DataFrame:
    aggs = [F.count(F.lit(1)).alias("intervals"),
            F.percentile_approx("p50_ms", 0.5).alias("median_p50_ms"),
            F.percentile_approx("p99_ms", 0.5).alias("median_p99_ms"),
            F.max("p99_ms").alias("worst_p99_ms"), F.max("max_ms").alias("max_ms")]
    per_shard = latency.groupBy("shard").agg(*aggs)
    overall = latency.agg(*aggs).withColumn("shard", F.lit(None).cast("int"))
    return per_shard.unionByName(overall).filter(F.col("intervals") > 0)


def _match_file(name: str, known: dict) -> str:
    """The listed input file a row's file path (maybe spelled file:///x) refers to."""
    if name in known:
        return name
    short = short_path(name)
    for f in known:
        if short_path(f) == short:
            return f
    return name


# -- command line -------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m warren.spark.report",
        description="Analyse Warren shard statistics logs (JSON lines, schema v1) with Spark.")
    parser.add_argument("inputs", nargs="+",
                        help="log directories (their shard-*.jsonl* files), globs or files; "
                             "local paths or Hadoop URIs (file://, hdfs://, ...)")
    parser.add_argument("--out", required=True,
                        help="output directory: a local path or a Hadoop URI")
    parser.add_argument("--master", default=None,
                        help="Spark master URL (default: spark-submit's, else local[*])")
    parser.add_argument("--shuffle-partitions", type=int, default=None,
                        help=f"spark.sql.shuffle.partitions (default {SHUFFLE_PARTITIONS}, "
                             f"{SMALL_SHUFFLE_PARTITIONS} for local inputs under "
                             f"{SMALL_INPUT_BYTES >> 20} MB)")
    parser.add_argument("--driver-memory", default="2g",
                        help="driver JVM heap when this command starts Spark (default 2g)")
    parser.add_argument("--top", type=int, default=10,
                        help="rows in the top backlog / redelivery tables (default 10)")
    parser.add_argument("--max-queue-rows", type=int, default=100,
                        help="queues listed in summary.md (all are in summary.json)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark setting (repeatable)")
    parser.add_argument("--pattern", default=DEFAULT_PATTERN,
                        help=f"file glob used inside input directories (default {DEFAULT_PATTERN})")
    parser.add_argument("--verbose", action="store_true",
                        help="show Spark's own log, its progress bar and Python warnings")
    args = parser.parse_args(argv)
    conf = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--conf wants KEY=VALUE, not {item!r}")
        conf[key] = value

    progress = Progress(sys.stderr)
    with warnings.catch_warnings():
        if not args.verbose:
            warnings.simplefilter("ignore")
        # A caller's active session (a notebook, a test) is used as it is and left running.
        existing = SparkSession.getActiveSession()
        if existing is None:
            progress("starting Spark...")
        size = local_input_bytes(args.inputs, args.pattern)
        small = size is not None and size < SMALL_INPUT_BYTES
        partitions = args.shuffle_partitions or (
            SMALL_SHUFFLE_PARTITIONS if small else SHUFFLE_PARTITIONS)
        spark = existing or build_session(args.master, partitions, args.driver_memory, conf,
                                          verbose=args.verbose, short_run=small)
        try:
            summary = run(args.inputs, args.out, spark, top=args.top,
                          max_queue_rows=args.max_queue_rows, pattern=args.pattern,
                          progress=progress)
        except FileNotFoundError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        finally:
            if existing is None:
                spark.stop()
    print(f"{summary['records']:,} records, {summary['bad_lines']:,} bad lines, "
          f"{len(summary['queues'])} queues, {len(summary['shards'])} shards in "
          f"{summary['elapsed_seconds']:.1f} s; report in {args.out}/summary.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
