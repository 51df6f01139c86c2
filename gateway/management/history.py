"""The last minutes of counters and queue lengths, kept server-side as RabbitMQ
keeps them, so a chart shows them as soon as a page loads: RabbitMQ's
?lengths_age=&lengths_incr= and ?msg_rates_age=&msg_rates_incr= answered with
`samples` in the *_details of the lengths and message_stats."""

from __future__ import annotations

import math
import re
from array import array
from bisect import bisect_right

KEPT_INCR = 5.0  # seconds between kept values, as RabbitMQ's basic retention
KEPT_AGE = 600.0  # seconds of history kept; older samples repeat the oldest value
MAX_SAMPLES = 500  # RabbitMQ refuses an age of more than 500 increments
QUEUE_FIELDS = ("published", "delivered", "redelivered", "acked", "ready", "unacked")
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


class _Kept:
    """One key's entries, flat in arrays (a busy queue keeps 121 of them)."""
    __slots__ = ("fields", "times", "values")

    def __init__(self, fields: tuple[str, ...]) -> None:
        self.fields = fields
        self.times = array("d")  # each entry's boundary, oldest first
        self.values = array("q")  # each entry's values in the order of `fields`, end to end

    def row(self, index: int) -> array:
        n = len(self.fields)
        return self.values[index * n:(index + 1) * n]


class History:
    """Values by key (a queue, the broker's totals), one entry per KEPT_INCR
    seconds of wall-clock time: the entry at a boundary holds the last values
    recorded at or before it, and one before the first holds what the key had
    before: its first values if it was there at the first record, else zeros (a
    queue declared since), as Rates assumes. An entry is added only when a value
    changed, so an idle queue keeps one."""

    def __init__(self) -> None:
        self._kept: dict[object, _Kept] = {}
        self._recorded = False

    def due(self, now: float, interval: float) -> bool:
        """Whether a sampler running every `interval` seconds records at `now`: the
        first time, and when its next sample, even half an interval late, would be
        past a boundary. Each entry then holds the values at its boundary to an
        interval and a half, for a fifth of the work of recording every sample."""
        return not self._recorded or \
            math.ceil((now + 1.5 * interval) / KEPT_INCR) != math.ceil(now / KEPT_INCR)

    def record(self, now: float, values_by_key: dict[object, dict[str, int]]) -> None:
        """Record every key's values at `now`; keys no longer given are forgotten."""
        for key in [k for k in self._kept if k not in values_by_key]:
            del self._kept[key]
        boundary = math.ceil(now / KEPT_INCR) * KEPT_INCR
        horizon = now - KEPT_AGE
        for key, values in values_by_key.items():
            row = array("q", values.values())
            kept = self._kept.get(key)
            if kept is None or kept.fields != tuple(values):
                kept = self._kept[key] = _Kept(tuple(values))
                kept.times.append(boundary - KEPT_INCR)
                kept.values.extend(array("q", [0]) * len(row) if self._recorded else row)
            n = len(row)
            if kept.times[-1] == boundary:
                kept.values[-n:] = row
            elif kept.values[-n:] != row:
                kept.times.append(boundary)
                kept.values.extend(row)
            # one entry at or before the horizon stands for the time before it
            drop = bisect_right(kept.times, horizon) - 1
            if drop > 0:
                del kept.times[:drop]
                del kept.values[:drop * n]
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
            if kept is None:
                continue
            fields = [(field, kept.fields.index(field)) for field in current
                      if field in kept.fields]
            for total, t in zip(sums[1:], times[1:]):
                row = kept.row(max(0, bisect_right(kept.times, t) - 1))
                for field, index in fields:
                    total[field] += row[index]
        return {field: [{"sample": total[field], "timestamp": int(t * 1000)}
                        for total, t in zip(sums, times)] for field in current}

    def entries(self, key) -> int:
        """How many entries `key` keeps (0 for a key not kept)."""
        kept = self._kept.get(key)
        return len(kept.times) if kept else 0


def kept_values(figures: dict[int, dict], totals: dict[str, int],
                vhost_of: dict[int, str]) -> dict[object, dict[str, int]]:
    """What History.record takes: each queue's counters and lengths by
    ("queue", qid), their sums by ("vhost", name) (what a user who sees only some
    vhosts is shown), and the broker's `totals` with all queues' lengths."""
    by_key: dict[object, dict[str, int]] = {}
    vhosts: dict[object, dict[str, int]] = {}
    lengths = {"ready": 0, "unacked": 0}
    for qid, figure in figures.items():
        values = by_key[("queue", qid)] = {name: figure[name] for name in QUEUE_FIELDS}
        for name in lengths:
            lengths[name] += values[name]
        if qid in vhost_of:
            summed = vhosts.setdefault(("vhost", vhost_of[qid]), dict.fromkeys(QUEUE_FIELDS, 0))
            for name, value in values.items():
                summed[name] += value
    by_key.update(vhosts)
    by_key["totals"] = {**totals, **lengths}
    return by_key


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
