"""How a paced client's wake-ups decide a broker's CPU at a steady rate, traced.

    python -m warren.loadtest.probes.clientwakes --external-client PATH [--compare] [--floor]
        [--scenario transient-autoack] [--rate 10000] [--rounds 1] [--shards 2]

At a steady `--rate` a broker's CPU follows how often the client writes: for
Warren each write is a read, a shard turn and a delivery's write. amqp-perf (on
Go 1.19, Debian's) sets that count itself, from how soon the broker answers. Its
publisher sleeps until the next message is due, and Go waits for a timer under a
millisecond with a 1 ms epoll timeout. So the client wakes early only when a
delivery arrives:
* A delivery that lands before the next message is due finds nothing to send.
  The client sleeps the rest of the millisecond, then sends the ten or so messages
  now due in one write.
* One that lands later wakes the client to write the one or two messages due.

The sooner a broker answers a lone publish, the more often the first happens, and
the fewer writes (and broker turns) carry the same messages.

This records the client's sleeps for `--seconds` (perf record on the epoll_pwait
tracepoints) while amqp-perf runs at `--rate` against a
fresh Warren, a private RabbitMQ (--compare) and the skeleton of loadtest/probes/floor.py
(--floor), alternating them each round. For each run it prints:
* the broker's cores (amqp-perf's broker_cores_avg);
* the client's writes a second, and messages a write (amqp-perf's own count);
* its sleeps (epoll waits with a timeout) ended by a delivery, and those ended by
  the timer;
* how long it slept before a delivery woke it (percentiles): the broker's answer
  time as the client sees it.

Needs perf (Debian: linux-perf) and the right to trace the client (root, or
kernel.perf_event_paranoid at -1 or below).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import external, procs
from ..procs import free_port, wait_for_port
from ..targets import ROOT, RabbitTarget, Target, WarrenTarget

TRACEPOINTS = ("syscalls:sys_enter_epoll_pwait", "syscalls:sys_exit_epoll_pwait")
_LINE = re.compile(r"\s*(\d+)\s+([\d.]+):\s+syscalls:(\w+):\s*(.*)")
_TIMEOUT = re.compile(r"timeout: (0x[0-9a-f]+)")


class FloorTarget(Target):
    """The skeleton broker of floor.py (the process split and nothing else)
    on a free port."""

    label = "floor"

    def __init__(self):
        port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "warren.loadtest.probes.floor", "--port", str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        if not wait_for_port(port, 30, alive=lambda: self.process.poll() is None):
            self.stop()
            raise RuntimeError("the floor broker did not start")
        super().__init__(f"amqp://guest:guest@127.0.0.1:{port}/%2F")
        self._root = self.process.pid

    def root_pid(self) -> int | None:
        return self.process.pid if self.process.poll() is None else None

    def stop(self) -> None:
        procs.stop(self.process, 10)


@dataclass
class Wakes:
    """What the client did over `seconds` of trace."""

    seconds: float = 0.0
    timer_wakes: int = 0  # sleeps the timer ended: nothing arrived in time
    delivery_wakes: int = 0  # sleeps a socket (a delivery) ended
    waits_us: list[float] = field(default_factory=list)  # how long each of those slept

    def per_s(self, count: int) -> float:
        return count / self.seconds if self.seconds else 0.0

    def wait_percentile(self, p: float) -> float | None:
        if not self.waits_us:
            return None
        ordered = sorted(self.waits_us)
        return ordered[round(p * (len(ordered) - 1))]


def analyse(lines) -> Wakes:
    """The client's wake-ups in `perf script -F tid,time,event,trace` output of the
    TRACEPOINTS. A sleep is an epoll wait with a timeout (not 0, the poll Go makes
    between goroutines); it returns 0 when the timer ended it."""
    wakes = Wakes()
    sleeping: dict[int, float] = {}  # thread -> when its sleep began
    first = last = None
    for line in lines:
        match = _LINE.match(line)
        if match is None:
            continue
        tid, at, event, args = int(match[1]), float(match[2]), match[3], match[4]
        first = at if first is None else first
        last = at
        if event == "sys_enter_epoll_pwait":
            timeout = _TIMEOUT.search(args)
            if timeout is not None and int(timeout[1], 16) != 0:
                sleeping[tid] = at
        elif event == "sys_exit_epoll_pwait" and tid in sleeping:
            began = sleeping.pop(tid)
            if int(args.split()[0], 16) == 0:
                wakes.timer_wakes += 1
            else:
                wakes.delivery_wakes += 1
                wakes.waits_us.append((at - began) * 1e6)
    if first is not None:
        wakes.seconds = last - first
    return wakes


def trace(pid: int, seconds: float, folder: Path) -> Wakes:
    data = folder / f"perf.{pid}.data"
    events = [arg for point in TRACEPOINTS for arg in ("-e", point)]
    subprocess.run(["perf", "record", "-q", "-o", str(data), *events, "-p", str(pid),
                    "--", "sleep", f"{seconds:g}"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "tid,time,event,trace"],
                            check=True, capture_output=True, text=True)
    return analyse(script.stdout.splitlines())


def measure(client: str, target, scenario: str, rate: float, warmup: float,
            seconds: float, folder: Path) -> tuple[Wakes, dict | None]:
    argv = external.command(client, target.url, scenario, warmup + seconds + 1, rate=rate,
                            pid=target.root_pid())
    perf = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        time.sleep(warmup)
        wakes = trace(perf.pid, seconds, folder)
        out, _ = perf.communicate(timeout=60)
        return wakes, external.parse_json_line(out)
    finally:
        if perf.poll() is None:
            perf.kill()


def row(label: str, wakes: Wakes, result: dict | None) -> str:
    result = result or {}
    cores = result.get("broker_cores_avg")
    published = result.get("published_per_s") or 0
    writes = result.get("client_writes_per_s") or 0
    waits = [wakes.wait_percentile(p) for p in (0.1, 0.5, 0.9)]
    return (f"{label:10} {cores if cores is not None else float('nan'):6.3f} "
            f"{writes:8,.0f} {published / writes if writes else 0:6.1f} "
            f"{wakes.per_s(wakes.delivery_wakes):9,.0f} {wakes.per_s(wakes.timer_wakes):7,.0f}   "
            + " / ".join("-" if w is None else f"{w:.0f}" for w in waits))


HEADER = ("broker      cores  writes/s msg/wr  delivery   timer   slept before a delivery, "
          "µs p10 / p50 / p90\n" + "-" * 98)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m warren.loadtest.probes.clientwakes",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--external-client", required=True, metavar="PATH",
                        help="amqp-perf (or a client taking its arguments)")
    parser.add_argument("--scenario", default="transient-autoack")
    parser.add_argument("--rate", type=float, default=10000.0, help="messages a second")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--seconds", type=float, default=2.0, help="the traced window")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--compare", action="store_true", help="and a private RabbitMQ")
    parser.add_argument("--floor", action="store_true", help="and the skeleton broker")
    options = parser.parse_args(argv)
    if shutil.which("perf") is None:
        raise SystemExit("perf is not installed (Debian: apt-get install linux-perf)")
    makers = [("warren", lambda: WarrenTarget(options.shards))]
    if options.compare:
        rabbit = RabbitTarget()  # one node for every round: its start takes seconds
        makers.append(("rabbitmq", lambda: rabbit))
    if options.floor:
        makers.append(("floor", FloorTarget))
    print(f"{options.scenario} at {options.rate:g} msg/s, {options.seconds:g} s traced "
          f"after {options.warmup:g} s\n{HEADER}")
    try:
        with tempfile.TemporaryDirectory(prefix="warren-clientwakes-") as tmp:
            for _ in range(options.rounds):
                for label, make in makers:
                    target = make()
                    try:
                        wakes, result = measure(options.external_client, target,
                                                options.scenario, options.rate,
                                                options.warmup, options.seconds, Path(tmp))
                    finally:
                        if label != "rabbitmq":  # a fresh broker each run
                            target.stop()
                    print(row(label, wakes, result), flush=True)
    finally:
        if options.compare:
            rabbit.stop()


if __name__ == "__main__":
    main()
