"""The report's tables, computed with the DataFrame API from the parsed records.

Counters in queue_stats/shard_stats records are cumulative since the shard process
started (or the queue was declared). A series is cut into segments where a counter
drops, or where a ``shard_started`` event (for the shard) or ``queue_declared`` event
(for the queue) lies between two records; the total is the sum over segments of each
segment's last value, i.e. the sum of positive deltas with a reset counting its new
value.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from .logs import COUNTERS, GAUGES, LATENCIES, SHARD_COUNTERS

RATED = ("published", "delivered", "acked", "redelivered")
TABLES = ("queue_rates", "queue_totals", "shard_rates", "shard_balance", "top_backlog",
          "top_redeliveries", "confirm_latency", "fsync_batches", "consumer_timeouts",
          "bad_lines")


# -- cumulative counters ------------------------------------------------------------------

def cumulative_deltas(series: DataFrame, markers: DataFrame, keys: list[str],
                      counters: tuple[str, ...]) -> DataFrame:
    """Per-record increments of cumulative `counters` within each `keys` series.

    A record starts a new segment when it is the first of its series, when a marker
    (restart/redeclaration, rows of keys + ts) lies since the previous record, or when
    the counter dropped; a new segment's increment is the counter's value itself.
    Adds epoch, prev_ts, interval_s, new_segment and d_<counter> columns."""
    data = series.withColumn("_marker", F.lit(0))
    marks = markers.select(*keys, "ts", F.lit(1).alias("_marker"))
    order = Window.partitionBy(*keys).orderBy(F.col("ts"), F.col("_marker").desc())
    running = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    before = order.rowsBetween(Window.unboundedPreceding, -1)
    columns = [c for c in series.columns]
    # Both windows share one partitioning and order: Spark sorts once.
    epochs = (data.unionByName(marks, allowMissingColumns=True)
              .select(*columns, "_marker", F.sum("_marker").over(running).alias("epoch"))
              .filter(F.col("_marker") == 0))
    prev = epochs.select(
        *columns, "epoch", F.lag("ts").over(order).alias("prev_ts"),
        F.lag("epoch").over(order).alias("_prev_epoch"),
        *[F.last(n, ignorenulls=True).over(before).alias(f"_prev_{n}") for n in counters])
    new_segment = F.col("prev_ts").isNull() | (F.col("epoch") != F.col("_prev_epoch"))
    flagged = prev.select(*columns, "epoch", "prev_ts", *[f"_prev_{n}" for n in counters],
                          new_segment.alias("new_segment"))
    deltas = []
    for name in counters:
        cur, last = F.col(name), F.col(f"_prev_{name}")
        deltas.append(F.when(cur.isNull(), F.lit(None))
                      .when(F.col("new_segment") | last.isNull() | (cur < last), cur)
                      .otherwise(cur - last).alias(f"d_{name}"))
    interval = F.col("ts") - F.col("prev_ts")
    return flagged.select(*columns, "epoch", "prev_ts", "new_segment",
                          F.when(interval > 0, interval).alias("interval_s"), *deltas)


def _rate(delta: str) -> F.Column:
    return F.try_divide(F.col(delta), F.col("interval_s"))


def events_of(valid: DataFrame) -> DataFrame:
    return (valid.filter(F.col("type") == "event")
            .select("shard", "ts", "kind", F.coalesce("vhost", F.lit("/")).alias("vhost"),
                    "queue"))


def queue_deltas(valid: DataFrame, events: DataFrame) -> DataFrame:
    """queue_stats records with d_<counter> increments, reset-aware, per
    (vhost, queue, shard) series."""
    keys = ["vhost", "queue", "shard"]
    stats = (valid.filter((F.col("type") == "queue_stats") & F.col("queue").isNotNull())
             .select(F.coalesce("vhost", F.lit("/")).alias("vhost"), "queue", "shard", "ts",
                     F.coalesce("queue_type", F.lit("classic")).alias("queue_type"),
                     *COUNTERS, *GAUGES))
    series_keys = stats.select(*keys).distinct()
    restarts = (events.filter(F.col("kind") == "shard_started").select("shard", "ts")
                .join(series_keys, "shard"))
    declared = (events.filter((F.col("kind") == "queue_declared") & F.col("queue").isNotNull())
                .select(*keys, "ts"))
    markers = restarts.select(*keys, "ts").unionByName(declared)
    return cumulative_deltas(stats, markers, keys, COUNTERS)


def shard_deltas(valid: DataFrame, events: DataFrame) -> DataFrame:
    """shard_stats records with d_fsyncs / d_messages increments, reset-aware."""
    stats = (valid.filter(F.col("type") == "shard_stats")
             .select("shard", "ts", *SHARD_COUNTERS))
    restarts = events.filter(F.col("kind") == "shard_started").select("shard", "ts")
    return cumulative_deltas(stats, restarts, ["shard"], SHARD_COUNTERS)


# -- the tables ---------------------------------------------------------------------------

def queue_rates(qd: DataFrame) -> DataFrame:
    """Per queue per interval: every counter's increment (named after the counter),
    rates per second, gauges, and whether the record starts a new counter segment."""
    return qd.select(
        F.timestamp_seconds("ts").alias("time"), "ts", "vhost", "queue", "shard", "queue_type",
        "interval_s", "new_segment", *[F.col(f"d_{c}").alias(c) for c in COUNTERS],
        *[_rate(f"d_{c}").alias(f"{c}_per_s") for c in RATED],
        "ready", "unacked", "consumers", "ram_bytes")


def queue_totals(rates: DataFrame) -> DataFrame:
    """Per queue, from the queue_rates increments: reset-aware counter totals, peak and
    final gauges."""
    sums = [F.coalesce(F.sum(c), F.lit(0)).cast("long").alias(c) for c in COUNTERS]
    return (rates.groupBy("vhost", "queue").agg(
        F.max_by("shard", "ts").alias("shard"),
        F.max_by("queue_type", "ts").alias("queue_type"),
        *sums,
        F.coalesce(F.max("ready"), F.lit(0)).cast("long").alias("peak_ready"),
        F.max_by("ts", "ready").alias("peak_ready_ts"),
        F.coalesce(F.max("unacked"), F.lit(0)).cast("long").alias("peak_unacked"),
        F.max_by("ready", "ts").alias("final_ready"),
        F.max_by("unacked", "ts").alias("final_unacked"),
        F.max_by("consumers", "ts").alias("final_consumers"),
        F.sum(F.col("new_segment").cast("long")).alias("segments"),
        F.count(F.lit(1)).alias("samples"),
        F.min("ts").alias("first_ts"), F.max("ts").alias("last_ts"))
        .withColumn("redelivery_ratio", F.try_divide(F.col("redelivered"), F.col("delivered"))))


def shard_rates(rates: DataFrame, sd: DataFrame) -> DataFrame:
    """Per shard per interval: the queues' increments summed at each tick (queue and
    shard records of a tick share its ts) joined with the shard's fsync counters."""
    ticks = rates.groupBy("shard", "ts").agg(
        *[F.sum(c).alias(c) for c in RATED],
        F.sum("ready").alias("ready"), F.sum("unacked").alias("unacked"),
        F.count(F.lit(1)).alias("queues"))
    shard = sd.select("shard", "ts", F.col("d_fsyncs").alias("fsyncs"),
                      F.col("d_messages").alias("messages"))
    joined = ticks.join(shard, ["shard", "ts"], "full")
    order = Window.partitionBy("shard").orderBy("ts")
    interval = F.col("ts") - F.lag("ts").over(order)
    joined = joined.withColumn("interval_s", F.when(interval > 0, interval))
    return joined.select(
        F.timestamp_seconds("ts").alias("time"), "ts", "shard", "interval_s",
        *[F.coalesce(F.col(c), F.lit(0)).cast("long").alias(c) for c in RATED],
        "fsyncs", "messages",
        *[_rate(c).alias(f"{c}_per_s") for c in RATED + SHARD_COUNTERS],
        "ready", "unacked", "queues")


def shard_balance(valid: DataFrame, totals: DataFrame, sd: DataFrame) -> DataFrame:
    """Per shard: traffic totals and its share of all published/delivered messages,
    queue count, fsyncs and mean fsync batch. Every shard seen in any record is listed."""
    shards = valid.groupBy("shard").agg(F.count(F.lit(1)).alias("records"))
    traffic = totals.groupBy("shard").agg(
        F.count(F.lit(1)).alias("queues"),
        *[F.sum(c).alias(c) for c in ("published", "published_bytes", "delivered", "acked",
                                      "redelivered", "timeouts")],
        F.sum("peak_ready").alias("sum_peak_ready"))
    disk = sd.groupBy("shard").agg(*[F.sum(f"d_{c}").alias(c) for c in SHARD_COUNTERS])
    joined = shards.join(traffic, "shard", "left").join(disk, "shard", "left")
    numbers = ("queues", "published", "published_bytes", "delivered", "acked", "redelivered",
               "timeouts", "sum_peak_ready", "fsyncs", "messages")
    joined = joined.select("shard", "records",
                           *[F.coalesce(F.col(c), F.lit(0)).cast("long").alias(c)
                             for c in numbers])
    all_ = joined.agg(*[F.sum(c).alias(f"all_{c}") for c in ("queues", "published", "delivered",
                                                               "acked")])
    share = {c: F.try_divide(F.col(c), F.col(f"all_{c}")) for c in
             ("queues", "published", "delivered", "acked")}
    return (joined.crossJoin(all_)
            .select("shard", "records", *numbers,
                    *[share[c].alias(f"share_{c}") for c in share],
                    F.try_divide(F.col("messages"), F.col("fsyncs")).alias("mean_fsync_batch")))


def top_backlog(totals: DataFrame, n: int) -> DataFrame:
    """The `n` queues with the highest peak ready count."""
    return (totals.filter(F.col("peak_ready") > 0)
            .select("vhost", "queue", "shard", "peak_ready", "peak_ready_ts",
                    F.timestamp_seconds("peak_ready_ts").alias("peak_ready_time"),
                    "final_ready", "peak_unacked", "published", "delivered")
            .orderBy(F.desc("peak_ready"), "vhost", "queue").limit(n))


def top_redeliveries(totals: DataFrame, n: int) -> DataFrame:
    """The `n` queues with the most redeliveries."""
    return (totals.filter(F.col("redelivered") > 0)
            .select("vhost", "queue", "shard", "redelivered", "delivered", "requeued",
                    "rejected", "redelivery_ratio")
            .orderBy(F.desc("redelivered"), "vhost", "queue").limit(n))


def confirm_latency(valid: DataFrame) -> DataFrame:
    """Per shard per interval: publisher-confirm latency percentiles (ms)."""
    lat = F.col("confirm_latency_ms")
    return (valid.filter((F.col("type") == "shard_stats") & lat.isNotNull()
                         & lat["p50"].isNotNull())
            .select(F.timestamp_seconds("ts").alias("time"), "ts", "shard",
                    *[lat[p].alias(f"{p}_ms") for p in LATENCIES]))


def fsync_batches(valid: DataFrame) -> DataFrame:
    """Histogram totals of messages per fsync: bucket b counts commits of
    b/2+1 .. b messages (bucket 1: 0-1)."""
    pairs = (valid.filter((F.col("type") == "shard_stats") & F.col("fsync_batch").isNotNull())
             .select(F.explode("fsync_batch").alias("key", "fsyncs"))
             .select(F.expr("try_cast(key AS BIGINT)").alias("bucket"), "fsyncs")
             .filter(F.col("bucket").isNotNull() & (F.col("bucket") > 0)))
    hist = pairs.groupBy("bucket").agg(F.sum("fsyncs").cast("long").alias("fsyncs"))
    total = hist.agg(F.sum("fsyncs").alias("_total"))
    return (hist.crossJoin(total).select(
        "bucket",
        F.when(F.col("bucket") <= 1, F.lit(0)).otherwise(
            F.floor(F.col("bucket") / 2) + 1).cast("long").alias("min_messages"),
        F.col("bucket").alias("max_messages"), "fsyncs",
        F.try_divide(F.col("fsyncs"), F.col("_total")).alias("share")))


def consumer_timeouts(totals: DataFrame, events: DataFrame) -> DataFrame:
    """Per queue: consumer timeouts from the `timeouts` counter and from
    consumer_timed_out events (queues with neither are left out)."""
    counted = (events.filter((F.col("kind") == "consumer_timed_out") & F.col("queue").isNotNull())
               .groupBy("vhost", "queue").agg(F.count(F.lit(1)).alias("timeout_events")))
    joined = totals.select("vhost", "queue", "shard", F.col("timeouts").alias("timeouts_counter")
                           ).join(counted, ["vhost", "queue"], "full")
    return (joined.select("vhost", "queue", "shard",
                          F.coalesce("timeouts_counter", F.lit(0)).cast("long")
                          .alias("timeouts_counter"),
                          F.coalesce("timeout_events", F.lit(0)).cast("long")
                          .alias("timeout_events"))
            .filter((F.col("timeouts_counter") > 0) | (F.col("timeout_events") > 0)))


def bad_lines(parsed: DataFrame) -> DataFrame:
    """Every bad line: its file, why, and (the start of) its text."""
    return (parsed.filter(F.col("status") != "ok")
            .select("file", F.col("status").alias("reason"), "line"))


def bucket_label(h: dict) -> str:
    """A fsync_batches bucket as text: "0-1", "2", "3-4", "5-8", ..."""
    lo, hi = h["min_messages"], h["max_messages"]
    return str(hi) if lo == hi else f"{lo}-{hi}"
