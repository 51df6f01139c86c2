"""The report's summary: summary.md, the page to read first, and summary.json."""

from __future__ import annotations

import datetime as _dt
import json
import math
import os

from .charts import CHARTS
from .logs import iso_time, short_path
from .output import DATA_DIR
from .tables import TABLES, bucket_label


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value).replace("|", "\\|")


def _table(headers: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join("---" if i < 2 else "---:" for i in range(len(headers))) + "|"]
    out += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return out


def _table_or(headers: list[str], rows: list[list], none: str) -> list[str]:
    """The table, or the sentence `none` when it has no rows."""
    return _table(headers, rows) if rows else [none]


def balance_verdict(shards: list[dict], queues: list[dict]) -> list[str]:
    """A few sentences on whether xxhash placement spreads the load."""
    active = [s for s in shards if s["queues"] or s["published"]]
    if len(shards) < 2 or not queues:
        return ["Fewer than two shards or no queues: nothing to balance."]
    n = len(shards)
    mean_q = sum(s["queues"] for s in shards) / n
    mean_p = sum(s["published"] for s in shards) / n
    q_ratio = max(s["queues"] for s in shards) / mean_q if mean_q else 0.0
    p_ratio = max(s["published"] for s in shards) / mean_p if mean_p else 0.0
    total = sum(q["published"] for q in queues)
    busiest = max(queues, key=lambda q: q["published"])
    lines = [f"{len(active)} of {n} shards hold queues or traffic. Busiest shard / mean: "
             f"**{q_ratio:.2f}x** for queue count, **{p_ratio:.2f}x** for published messages "
             "(1.00x is perfectly even)."]
    if p_ratio <= 1.25:
        lines.append("xxhash placement spreads the load well.")
    elif q_ratio <= 1.25:
        share = 100 * busiest["published"] / total if total else 0
        lines.append("xxhash spreads the queues evenly; the traffic imbalance comes from the "
                     f"queues themselves: the busiest queue (`{busiest['name']}` in vhost "
                     f"`{busiest['vhost']}`) carries {share:.1f}% of all published messages.")
    else:
        lines.append(f"Placement is uneven: with {len(queues)} queues over {n} shards, hashing "
                     "alone leaves some shards with noticeably more queues than others.")
    return lines


def render_markdown(s: dict, max_queue_rows: int) -> str:
    md = ["# Warren shard statistics report", ""]
    span = s["time_span"]
    md += [f"Generated {s['generated_at']} in {s['elapsed_seconds']:.1f} s by `spark/report.py` "
           f"(Spark {s['spark_version']}).", "",
           f"* **{s['records']:,} records**, **{s['bad_lines']:,} bad lines** in "
           f"{len(s['files'])} files",
           f"* Time span: {iso_time(span['start'])} .. {iso_time(span['end'])} "
           f"({_fmt(span['seconds'])} s)",
           f"* {len(s['queues'])} queues on {len(s['shards'])} shards",
           "* Records by type: " + (", ".join(f"{k} {v:,}" for k, v in
                                              sorted(s["records_by_type"].items())) or "none"),
           "* Events: " + (", ".join(f"{k} {v:,}" for k, v in
                                      sorted(s["events_by_kind"].items())) or "none"), ""]

    md += ["## Input files", ""]
    md += _table(["file", "lines", "records", "bad lines"],
                 [[f"`{short_path(f['file'])}`", f["lines"], f["records"], f["bad_lines"]]
                  for f in s["files"]])
    md += [""]

    md += ["## Bad lines", ""]
    if s["bad_lines"]:
        md += [f"{s['bad_lines']:,} lines could not be used (see the `bad_lines` table): "
               + ", ".join(f"{k} {v:,}" for k, v in sorted(s["bad_lines_by_reason"].items()))
               + ".", ""]
        md += _table(["file", "bad lines"], [[f"`{short_path(f['file'])}`", f["bad_lines"]]
                                             for f in s["files"] if f["bad_lines"]])
        md.append("")
        for example in s["bad_line_examples"]:
            text = (example["line"] or "")[:120].replace("`", "'")
            name = os.path.basename(short_path(example["file"]))
            md.append(f"* {example['reason']} in `{name}`: `{text}`")
    else:
        md.append("None: every line is a valid v1 record.")
    md += [""]

    md += ["## Queues", "",
           "Totals are reset-aware (counters restart when a shard restarts or a queue is "
           "redeclared; segments = how many counter runs were summed).", ""]
    queues = s["queues"]
    shown = sorted(queues, key=lambda q: (-q["published"], q["vhost"], q["name"]))[:max_queue_rows]
    md += _table(["vhost", "queue", "shard", "type", "published", "delivered", "acked",
                  "redelivered", "rejected", "timeouts", "peak ready", "final ready", "segments"],
                 [[q["vhost"], q["name"], q["shard"], q["queue_type"], q["published"],
                   q["delivered"], q["acked"], q["redelivered"], q["rejected"], q["timeouts"],
                   q["peak_ready"], q["final_ready"], q["segments"]] for q in shown])
    if len(queues) > len(shown):
        md += ["", f"{len(queues) - len(shown)} more queues (by published) in summary.json "
               "and the `queue_totals` table."]
    md += [""]

    md += ["## Shard balance", ""]
    md += _table(["shard", "queues", "published", "share published", "delivered",
                  "share delivered", "acked", "fsyncs", "messages stored", "mean fsync batch"],
                 [[sh["shard"], sh["queues"], sh["published"], _pct(sh["share_published"]),
                   sh["delivered"], _pct(sh["share_delivered"]), sh["acked"], sh["fsyncs"],
                   sh["messages"], sh["mean_fsync_batch"]] for sh in s["shards"]])
    md += [""] + balance_verdict(s["shards"], queues) + ["",
           "![shard balance](shard_balance.png)", "", "![throughput](throughput.png)", ""]

    md += ["## Top backlog (peak ready messages)", ""]
    md += _table_or(["vhost", "queue", "shard", "peak ready", "at", "final ready", "published"],
                    [[q["vhost"], q["queue"], q["shard"], q["peak_ready"],
                      iso_time(q["peak_ready_ts"]), q["final_ready"], q["published"]]
                     for q in s["top_backlog"]], "No queue ever had ready messages.")
    md += [""]

    md += ["## Top redeliveries", ""]
    md += _table_or(["vhost", "queue", "shard", "redelivered", "delivered", "requeued",
                     "redelivered %"],
                    [[q["vhost"], q["queue"], q["shard"], q["redelivered"], q["delivered"],
                      q["requeued"], _pct(q["redelivery_ratio"])] for q in s["top_redeliveries"]],
                    "No redeliveries.")
    md += [""]

    md += ["## Publisher confirm latency", "",
           "Shards log p50/p90/p99/max per interval; below: intervals with confirms, the "
           "median of the interval p50s and p99s, and the worst p99 and max.", ""]
    md += _table_or(["shard", "intervals", "median p50 ms", "median p99 ms", "worst p99 ms",
                     "max ms"],
                    [[c["shard"] if c["shard"] is not None else "all", c["intervals"],
                      c["median_p50_ms"], c["median_p99_ms"], c["worst_p99_ms"], c["max_ms"]]
                     for c in s["confirm_latency"]], "No confirms were recorded.")
    md += ["", "![confirm latency](confirm_latency.png)", ""]

    md += ["## fsync batch sizes", ""]
    if s["fsync_batches"]:
        total_fsyncs = sum(h["fsyncs"] for h in s["fsync_batches"])
        md += [f"{total_fsyncs:,} fsyncs; messages per fsync:", ""]
        md += _table(["messages per fsync", "fsyncs", "share"],
                     [[bucket_label(h), h["fsyncs"], _pct(h["share"])]
                      for h in s["fsync_batches"]])
    else:
        md.append("No durable writes were recorded.")
    md += ["", "![fsync batch sizes](fsync_batches.png)", ""]

    md += ["## Consumer timeouts", ""]
    md += _table_or(["vhost", "queue", "shard", "timeouts (counter)", "consumer_timed_out events"],
                    [[c["vhost"], c["queue"], c["shard"], c["timeouts_counter"],
                      c["timeout_events"]] for c in s["consumer_timeouts"]],
                    "No consumer timeouts.")
    md += ["", "## Outputs", "",
           f"Parquet tables in `{DATA_DIR}/`: "
           + ", ".join(f"[`{t}`]({DATA_DIR}/{t}/)" for t in TABLES) + ".", "",
           "Charts: " + ", ".join(f"[{name}]({png})" for name, png in CHARTS.items()) + ".", ""]
    return "\n".join(md)


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _clean(value):
    """JSON-safe: Rows to dicts, non-finite floats to None, datetimes to ISO text."""
    if hasattr(value, "asDict"):
        return {k: _clean(v) for k, v in value.asDict().items()}
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, _dt.datetime):
        return value.isoformat()
    return value


def render_json(s: dict) -> str:
    return json.dumps(_clean(s), indent=2)
