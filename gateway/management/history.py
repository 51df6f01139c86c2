"""The last minutes of counters and queue lengths, kept server-side as RabbitMQ
keeps them, so a chart shows them as soon as a page loads: RabbitMQ's
?lengths_age=&lengths_incr= and ?msg_rates_age=&msg_rates_incr= answered with
`samples` in the *_details of the lengths and message_stats."""

from __future__ import annotations

import math
import re
from bisect import bisect_right

KEPT_INCR = 5.0  # seconds between kept values, as RabbitMQ's basic retention
KEPT_AGE = 600.0  # seconds of history kept; older samples repeat the oldest value
MAX_SAMPLES = 500  # RabbitMQ refuses an age of more than 500 increments
_INTEGER = re.compile(r"-?[0-9]+")


def sample_range(query: dict[str, str], prefix: str) -> tuple[int, int] | None:
    """(age, incr) in seconds from {prefix}_age and {prefix}_incr; None when
    either is missing or not an integer, which RabbitMQ ignores too. ValueError,
    in RabbitMQ's words, for a range it refuses."""
    age, incr = query.get(prefix + "_age", ""), query.get(prefix + "_incr", "")
    if not (_INTEGER.fullmatch(age) and _INTEGER.fullmatch(incr)):
        return None
    age, incr = int(age), int(incr)
    if age <= 0 or incr <= 0 or age > incr * MAX_SAMPLES:
        raise ValueError(f"Invalid range parameters: age {age}, incr {incr}")
    return age, incr


class History:
    """Values by key (a queue, the broker's totals), one entry per KEPT_INCR
    seconds of wall-clock time: the entry at a boundary holds the last values
    recorded at or before it, and one before the first holds what the key had
    before: its first values if it was there at the first record, else zeros (a
    queue declared since), as Rates assumes. An entry is added only when a value
    changed, so an idle queue keeps one."""

    def __init__(self) -> None:
        self._kept: dict[object, list] = {}  # key -> [(boundary, values)], oldest first
        self._recorded = False

    def record(self, now: float, values_by_key: dict[object, dict[str, int]]) -> None:
        """Record every key's values at `now`; keys no longer given are forgotten."""
        for key in [k for k in self._kept if k not in values_by_key]:
            del self._kept[key]
        boundary = math.ceil(now / KEPT_INCR) * KEPT_INCR
        horizon = now - KEPT_AGE
        for key, values in values_by_key.items():
            kept = self._kept.setdefault(key, [])
            if not kept:  # what it was before: zero for a key new since the first record
                before = dict.fromkeys(values, 0) if self._recorded else dict(values)
                kept.append((boundary - KEPT_INCR, before))
            if kept[-1][0] == boundary:
                kept[-1] = (boundary, dict(values))
            elif kept[-1][1] != values:
                kept.append((boundary, dict(values)))
            # one entry at or before the horizon stands for the time before it
            drop = bisect_right(kept, horizon, key=lambda entry: entry[0]) - 1
            if drop > 0:
                del kept[:drop]
        self._recorded = True

    def samples(self, keys, now: float, age: int, incr: int,
                current: dict[str, int]) -> dict[str, list[dict]]:
        """Per field of `current`: age // incr + 1 samples, newest first, `incr`
        seconds apart, as RabbitMQ's {"sample", "timestamp" (ms)}. The newest is
        `current`; each older one the sum over `keys` of the values last recorded
        at or before its time (before its history, what it had before)."""
        newest = math.ceil(now / incr) * incr
        times = [newest - i * incr for i in range(age // incr + 1)]
        sums = [dict(current)] + [dict.fromkeys(current, 0) for _ in times[1:]]
        for key in keys:
            kept = self._kept.get(key)
            if not kept:
                continue
            bounds = [boundary for boundary, _ in kept]
            for total, t in zip(sums[1:], times[1:]):
                values = kept[max(0, bisect_right(bounds, t) - 1)][1]
                for field in current:
                    total[field] += values.get(field, 0)
        return {field: [{"sample": total[field], "timestamp": int(t * 1000)}
                        for total, t in zip(sums, times)] for field in current}


def details(rate: float, samples: list[dict], incr: int) -> dict:
    """A *_details object with samples, as RabbitMQ's: the current rate, the
    average rate over the samples' span and the samples' mean."""
    values = [s["sample"] for s in samples]
    span = (len(values) - 1) * incr
    return {"rate": rate, "samples": samples,
            "avg_rate": (values[0] - values[-1]) / span if span else 0.0,
            "avg": sum(values) / len(values)}


def add_samples(query: dict[str, str], history: History, keys, now: float,
                lengths: dict, stats: dict, stat_fields) -> None:
    """Adds the samples `query` asks for to `lengths` (messages_ready,
    messages_unacknowledged, messages) and to `stats` (message_stats, whose
    (name, kept field) pairs `stat_fields` gives), summed over `keys`."""
    lengths_range = sample_range(query, "lengths")
    rates_range = sample_range(query, "msg_rates")
    if lengths_range:
        age, incr = lengths_range
        kept = history.samples(keys, now, age, incr, {
            "ready": lengths["messages_ready"], "unacked": lengths["messages_unacknowledged"]})
        total = [{"sample": a["sample"] + b["sample"], "timestamp": a["timestamp"]}
                 for a, b in zip(kept["ready"], kept["unacked"])]
        for name, samples in (("messages_ready", kept["ready"]),
                              ("messages_unacknowledged", kept["unacked"]),
                              ("messages", total)):
            rate = lengths.get(f"{name}_details", {}).get("rate", 0.0)
            lengths[f"{name}_details"] = details(rate, samples, incr)
    if rates_range:
        age, incr = rates_range
        shown = [(name, field) for name, field in stat_fields if name in stats]
        kept = history.samples(keys, now, age, incr, {field: stats[name] for name, field in shown})
        for name, field in shown:
            stats[f"{name}_details"] = details(stats[f"{name}_details"]["rate"], kept[field], incr)
