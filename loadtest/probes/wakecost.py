"""What waking a sleeping process costs on this machine: the floor under the
broker's CPU at a steady rate.

At a steady rate each shard turn takes two cross-process wake-ups that a broker
in one process does not: the gateway rings the shard's doorbell, and the shard
rings the gateway's. `python -m warren.loadtest.probes.wakecost` measures one such
wake-up in the doorbell's own shape: a waker writes an eventfd every `--gap`
microseconds (busy meanwhile, as a process doing its work), and a wakee on
another CPU sleeps on it in epoll and drains it on each wake, as the gateway's
event loop does. It reports the CPU time each side spends per wake-up (the
waker's write alone; the wakee's whole loop, which does nothing else), and what
two of them per shard turn cost at `--turns` shard turns a second.

On bare metal a wake-up costs a few microseconds; in a virtual machine, where
waking an idle CPU takes an interrupt through the hypervisor, several times
that. `--same-cpu` puts both on one CPU, as load compaction does with the
broker's processes while it is lightly loaded (gateway/compaction.py): the
difference is what compaction saves a wake-up."""

from __future__ import annotations

import argparse
import json
import os
import select
import time

STOP = 1 << 40  # a count no run of single writes reaches: the wakee's signal to stop


def _wakee(fd: int, cpu: int | None, results: int) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    poller = select.epoll()
    poller.register(fd, select.EPOLLIN)
    wakes = 0
    started = time.process_time()
    while True:
        poller.poll()
        value = os.eventfd_read(fd)
        if value >= STOP:
            break
        wakes += 1
    spent = time.process_time() - started
    os.write(results, json.dumps({"wakes": wakes, "cpu": spent}).encode())
    os._exit(0)


def measure(count: int, gap_us: float, same_cpu: bool = False) -> dict:
    cpus = sorted(os.sched_getaffinity(0))
    if same_cpu:
        waker_cpu = wakee_cpu = cpus[0]
    else:
        waker_cpu, wakee_cpu = (cpus[0], cpus[1]) if len(cpus) > 1 else (None, None)
    fd = os.eventfd(0)
    results_read, results_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(results_read)
        _wakee(fd, wakee_cpu, results_write)
    os.close(results_write)
    if waker_cpu is not None:
        os.sched_setaffinity(0, {waker_cpu})
    time.sleep(0.2)  # the wakee asleep in epoll
    gap = gap_us / 1e6
    writing = 0.0
    for _ in range(count):
        until = time.perf_counter() + gap
        while time.perf_counter() < until:  # busy, so the waker's own CPU stays awake
            pass
        before = time.thread_time()
        os.eventfd_write(fd, 1)
        writing += time.thread_time() - before
    time.sleep(gap * 10)
    os.eventfd_write(fd, STOP)
    os.waitpid(pid, 0)
    wakee = json.loads(os.read(results_read, 4096))
    os.close(results_read)
    os.close(fd)
    return {"writes": count, "wakes": wakee["wakes"],
            "waker_us_per_write": writing / count * 1e6,
            "wakee_us_per_wake": wakee["cpu"] / max(wakee["wakes"], 1) * 1e6,
            "across_cpus": waker_cpu != wakee_cpu}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m warren.loadtest.probes.wakecost",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20000, help="wake-ups to time")
    parser.add_argument("--gap", type=float, default=150.0,
                        help="microseconds between wake-ups (default 150: a shard turn's "
                             "spacing at 10,000 msg/s)")
    parser.add_argument("--turns", type=float, default=5000.0,
                        help="shard turns a second to price (two wake-ups each)")
    parser.add_argument("--same-cpu", action="store_true",
                        help="waker and wakee on one CPU (as under load compaction)")
    parser.add_argument("--json", action="store_true", help="one JSON line")
    args = parser.parse_args(argv)
    result = measure(args.count, args.gap, args.same_cpu)
    pair = result["waker_us_per_write"] + result["wakee_us_per_wake"]
    result["cores_at_turns"] = round(2 * pair * args.turns / 1e6, 3)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"waker  {result['waker_us_per_write']:6.2f} µs CPU a doorbell write")
    print(f"wakee  {result['wakee_us_per_wake']:6.2f} µs CPU a wake-up "
          f"({result['wakes']:,} of {result['writes']:,} writes woke it"
          f"{', on another CPU' if result['across_cpus'] else ', on one CPU'})")
    print(f"two wake-ups a shard turn at {args.turns:,.0f} turns/s: "
          f"{result['cores_at_turns']:.3f} cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
