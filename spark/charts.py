"""The report's PNG charts, drawn with matplotlib from small series that Spark
aggregated (at most CHART_POINTS time buckets per series reach the driver)."""

from __future__ import annotations

import io

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .logs import iso_time
from .tables import bucket_label

CHART_POINTS = 400             # at most this many time buckets per chart series
CHARTS = {"throughput": "throughput.png", "shard_balance": "shard_balance.png",
          "confirm_latency": "confirm_latency.png", "fsync_batches": "fsync_batches.png"}


def chart_series(table: DataFrame, t0: float, t1: float, value_exprs: dict,
                 by: str = "shard") -> dict:
    """A small per-`by` time series of a per-interval table: raw points when there are
    few, else means over at most CHART_POINTS time buckets. Returns
    {key: {"t": [...], name: [...]}} with t in seconds since t0."""
    width = max((t1 - t0) / CHART_POINTS, 1e-9)
    bucket = F.floor((F.col("ts") - F.lit(t0)) / F.lit(width))
    rows = (table.groupBy(by, bucket.alias("_b"))
            .agg(F.avg("ts").alias("ts"), *[expr.alias(name) for name, expr in value_exprs.items()])
            .collect())
    rows.sort(key=lambda row: (row[by], row["_b"]))
    series: dict = {}
    for row in rows:
        s = series.setdefault(row[by], {"t": [], **{n: [] for n in value_exprs}})
        s["t"].append(row["ts"] - t0)
        for name in value_exprs:
            s[name].append(row[name])
    return series


def _figure(title: str):
    from matplotlib.figure import Figure
    fig = Figure(figsize=(10, 5), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title)
    return fig, ax


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")  # a bare Figure renders with the Agg canvas
    return buf.getvalue()


def _no_data(ax) -> None:
    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)


def _shard_lines_chart(title: str, series: dict, t0: float, solid: tuple[str, str],
                       dashed: tuple[str, str], unit: str, log_scale: bool = False) -> bytes:
    """Two lines per shard over time in the shard's colour: `solid` and `dashed`, each
    (series key, label)."""
    fig, ax = _figure(title)
    for shard in sorted(series):
        s = series[shard]
        line, = ax.plot(s["t"], s[solid[0]], label=f"shard {shard} {solid[1]}")
        ax.plot(s["t"], s[dashed[0]], linestyle="--", color=line.get_color(),
                label=f"shard {shard} {dashed[1]}")
    if series:
        ax.legend(fontsize="small", ncol=2)
        if log_scale:
            ax.set_yscale("log")
    else:
        _no_data(ax)
    ax.set_xlabel(f"seconds since {iso_time(t0)}")
    ax.set_ylabel(unit)
    ax.grid(alpha=0.3)
    return _png(fig)


def throughput_chart(series: dict, t0: float) -> bytes:
    return _shard_lines_chart("Throughput per shard (messages/s)", series, t0,
                              ("published_per_s", "published"),
                              ("delivered_per_s", "delivered"), "messages/s")


def balance_chart(shards: list[dict]) -> bytes:
    fig, ax = _figure("Shard balance: share of traffic and queues")
    if shards:
        n = len(shards)
        xs = list(range(n))
        width = 0.27
        for i, (key, label) in enumerate((("share_published", "published"),
                                          ("share_delivered", "delivered"),
                                          ("share_queues", "queues"))):
            ax.bar([x + (i - 1) * width for x in xs], [100 * (s[key] or 0) for s in shards],
                   width, label=label)
        ax.axhline(100 / n, color="grey", linestyle=":", label=f"even ({100 / n:.1f}%)")
        ax.set_xticks(xs, [f"shard {s['shard']}" for s in shards])
        ax.set_ylabel("% of total")
        ax.legend(fontsize="small")
    else:
        _no_data(ax)
    return _png(fig)


def latency_chart(series: dict, t0: float) -> bytes:
    return _shard_lines_chart("Publisher confirm latency per shard (ms)", series, t0,
                              ("p99_ms", "p99"), ("p50_ms", "p50"), "ms", log_scale=True)


def fsync_chart(hist: list[dict]) -> bytes:
    fig, ax = _figure("Messages per fsync (all shards)")
    if hist:
        labels = [bucket_label(h) for h in hist]
        ax.bar(range(len(hist)), [h["fsyncs"] for h in hist])
        ax.set_xticks(range(len(hist)), labels, rotation=45 if len(hist) > 8 else 0)
        ax.set_xlabel("messages per fsync")
        ax.set_ylabel("fsyncs")
    else:
        _no_data(ax)
    return _png(fig)
