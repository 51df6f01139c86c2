"""What the bench prints: progress on stderr, one JSON line per row, and the tables
(each scenario's figures; with --compare, Warren against RabbitMQ)."""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

# The client column of rows measured by the bench's own client (an external client's
# rows carry the executable's name).
OWN_CLIENT = "warren-bench"

# The figures of a row, in table order: (key, column title, format)
FIGURES = [
    ("published_per_s", "pub/s", "{:,.0f}"),
    ("confirmed_per_s", "conf/s", "{:,.0f}"),
    ("consumed_per_s", "cons/s", "{:,.0f}"),
    ("consumed_over_published", "cons/pub", "{:.2f}"),
    ("e2e_p50_ms", "e2e p50", "{:.2f}"),
    ("e2e_p99_ms", "e2e p99", "{:.2f}"),
    ("confirm_p50_ms", "conf p50", "{:.2f}"),
    ("confirm_p99_ms", "conf p99", "{:.2f}"),
    ("broker_rss_mb", "RSS MB", "{:,.0f}"),
    ("broker_cpu_s", "brk CPU", "{:.1f}"),
    ("broker_cores_avg", "brk cores", "{:.2f}"),
    ("client_cpu_s", "cli CPU", "{:.1f}"),
    # The load a steady rate offers: the client's write(2) calls per second (amqp-perf).
    # How many messages it packs into each follows its own timers, and those follow
    # how soon the broker's deliveries wake it: two brokers at one rate can get
    # different counts, and the broker's CPU follows the count (docs/performance.md, reading a row).
    ("client_writes_per_s", "cli wr/s", "{:,.0f}"),
]


def at_rate(name: str, rate: float) -> str:
    """A scenario's name with the rate its publishers keep (NAME@RATE), or alone for a flood."""
    return f"{name}@{rate:g}" if rate else name


def _rounds_label(name: str, row: dict[str, Any], repeated: bool) -> str:
    """A row's scenario, with its round when the run repeated scenarios (--repeat)."""
    return f"{name} #{row.get('round', 1)}" if repeated else name


def _repeated(rows) -> bool:
    return any(row.get("round", 1) > 1 for row in rows)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _fmt(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def _round(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {key: _round(item) for key, item in value.items()}
    return value


def print_json(row: dict[str, Any]) -> None:
    print(json.dumps(_round(row), sort_keys=False), flush=True)


def format_table(rows: list[dict[str, Any]]) -> str:
    headers = ["scenario", "broker", "client", "queue"] + [title for _, title, _ in FIGURES] + [
        "backlog RSS/PSS MB", "drain/s", "status"]
    lines = []
    repeated = _repeated(rows)
    for row in rows:
        cells = [_rounds_label(at_rate(row.get("client_scenario") or row["scenario"],
                                       row.get("rate")), row, repeated),
                 row["broker"],
                 row.get("client", OWN_CLIENT), row.get("queue_type") or ""]
        cells += [_fmt(row.get(key), fmt) for key, _, fmt in FIGURES]
        if row.get("backlog_rss_mb") is not None:
            cells.append(f"{row['backlog_rss_mb']:,.0f}/{row.get('backlog_pss_mb') or 0:,.0f}")
        else:
            cells.append("-")
        cells.append(_fmt(row.get("drain_per_s"), "{:,.0f}"))
        status = row["status"]
        if row.get("error"):
            status += ": " + row["error"].splitlines()[0][:80]
        elif row.get("note"):
            status += f" ({row['note']})"
        cells.append(status)
        lines.append(cells)
    return _render(headers, lines, right_from=4, last_left=True)


COMPARED = [("published_per_s", "pub/s"), ("confirmed_per_s", "conf/s"),
            ("consumed_per_s", "cons/s"), ("consumed_over_published", "cons/pub"),
            ("e2e_p50_ms", "e2e p50 ms"),
            ("e2e_p99_ms", "e2e p99 ms"), ("confirm_p50_ms", "conf p50 ms"),
            ("confirm_p99_ms", "conf p99 ms"), ("broker_rss_mb", "RSS MB"),
            ("backlog_rss_mb", "backlog RSS MB"), ("backlog_pss_mb", "backlog PSS MB"),
            ("drain_per_s", "drain/s"), ("broker_cpu_s", "broker CPU s"),
            ("broker_cores_avg", "broker cores"), ("client_cpu_s", "client CPU s"),
            ("client_writes_per_s", "client writes/s")]
# The one-line-per-scenario summary of --compare: Warren/RabbitMQ of these.
SUMMARY = [("published_per_s", "pub/s"), ("consumed_per_s", "cons/s"),
           ("broker_cores_avg", "CPU"), ("e2e_p99_ms", "e2e p99")]




def comparison(warren: dict[str, Any], rabbit: dict[str, Any]) -> dict[str, Any]:
    ratios = {}
    for key, _ in COMPARED:
        w, r = warren.get(key), rabbit.get(key)
        if isinstance(w, (int, float)) and isinstance(r, (int, float)) and r:
            ratios[key] = round(w / r, 3)
    return {"type": "comparison", "scenario": warren["scenario"],
            "client": warren.get("client", OWN_CLIENT),
            "rabbitmq_queue_type": rabbit.get("queue_type"),
            "warren": {k: warren.get(k) for k, _ in COMPARED},
            "rabbitmq": {k: rabbit.get(k) for k, _ in COMPARED},
            "warren_over_rabbitmq": ratios}


def format_comparison(pairs: list[tuple[dict, dict]]) -> str:
    lines = []
    header = ["scenario", "client", "figure", "Warren", "RabbitMQ", "W/R"]
    repeated = _repeated(warren for warren, _ in pairs)
    for warren, rabbit in pairs:
        name = _rounds_label(warren["scenario"], warren, repeated)
        client = warren.get("client", OWN_CLIENT)
        if warren["status"] != "ok" or rabbit["status"] != "ok":
            lines.append([name, client, "status", warren["status"], rabbit["status"], "-"])
        for key, title in COMPARED:
            w, r = warren.get(key), rabbit.get(key)
            if w is None and r is None:
                continue
            fmt = "{:,.0f}" if key.endswith("per_s") or "rss" in key or "pss" in key else "{:.2f}"
            title_ = title + (f" [{rabbit.get('queue_type')}]" if key == "published_per_s"
                              and warren["scenario"].partition("@")[0] == "persistent-confirm"
                              else "")
            lines.append([name, client, title_, _fmt(w, fmt), _fmt(r, fmt), _ratio(w, r)])
            name = client = ""
    return _render(header, lines, right_from=3)


def format_ratios(pairs: list[tuple[dict, dict]]) -> str:
    """One line per scenario and client: Warren/RabbitMQ of the SUMMARY figures (above 1 is
    Warren's more: better for rates, worse for CPU and latency) and each broker's
    consumed/published. With --repeat, a line per round, then the median of the rounds'
    figures (a round that failed counts in neither)."""
    header = ["scenario", "client"] + [f"W/R {title}" for _, title in SUMMARY] + [
        "cons/pub W", "cons/pub R", "status"]
    lines = []
    repeated = _repeated(warren for warren, _ in pairs)
    rounds: dict[tuple[str, str], list[tuple[dict, dict]]] = {}
    for warren, rabbit in pairs:
        rounds.setdefault((warren["scenario"], warren.get("client", OWN_CLIENT)), []).append(
            (warren, rabbit))
    for (scenario, client), group in rounds.items():
        for warren, rabbit in group:
            cells = [_rounds_label(scenario, warren, repeated), client]
            cells += [_ratio(warren.get(key), rabbit.get(key)) for key, _ in SUMMARY]
            cells += [_fmt(warren.get("consumed_over_published"), "{:.2f}"),
                      _fmt(rabbit.get("consumed_over_published"), "{:.2f}")]
            cells.append("ok" if warren["status"] == rabbit["status"] == "ok" else
                         f"warren {warren['status']}, rabbitmq {rabbit['status']}")
            lines.append(cells)
        if len(group) > 1:
            good = [(w, r) for w, r in group if w["status"] == r["status"] == "ok"]
            cells = [f"{scenario} median", client]
            cells += [_fmt(_median([_quotient(w.get(key), r.get(key)) for w, r in good]),
                           "{:.2f}") for key, _ in SUMMARY]
            cells += [_fmt(_median([w.get("consumed_over_published") for w, _ in good]),
                           "{:.2f}"),
                      _fmt(_median([r.get("consumed_over_published") for _, r in good]),
                           "{:.2f}")]
            cells.append(f"{len(good)} of {len(group)} rounds ok")
            lines.append(cells)
    return _render(header, lines, right_from=2, last_left=True)


def _quotient(w: Any, r: Any) -> float | None:
    if isinstance(w, (int, float)) and isinstance(r, (int, float)) and r:
        return w / r
    return None


def _median(values: list) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


def _ratio(w: Any, r: Any) -> str:
    return _fmt(_quotient(w, r), "{:.2f}")


def _render(header: list[str], lines: list[list[str]], right_from: int,
            last_left: bool = False) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *lines)]
    last = len(header) - 1 if last_left else len(header)

    def render(cells):
        return "  ".join(str(c).rjust(w) if right_from <= i < last else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([render(header), render(["-" * w for w in widths])]
                      + [render(c) for c in lines])
