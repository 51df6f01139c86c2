"""What a message costs the broker in CPU instructions: counted, not timed.

    python -m warren.loadtest.probes.instructions --external-client PATH
        [--scenario transient-autoack] [--rate 50] [--warmup 20] [--seconds 20] [--shards 2]
        [--keep DIR]

Timed figures (cores, microseconds a message) move by a quarter from run to run
on a shared two-core host, so a change worth a few percent cannot be seen in
them. Instruction counts can: this starts `warren serve` under valgrind's
callgrind (its shards too, --trace-children), runs the external client (amqp-perf)
at a low steady rate, and counts the instructions each process executes over a
window after the warm-up (callgrind_control dumps at its start and end). Runs
agree within about 3%. `--keep DIR` keeps the window's dumps (cg.PID.2) for
callgrind_annotate, to see which C functions the instructions went to.

The default rate, 50 messages a second, is low enough that valgrind (which
slows the broker some 50 times) leaves every message alone: its own client write
and its own wake of each process, the shape of a steady rate, where most of a
message's cost is the turns it takes. Instructions are not time (a cold cache
makes the same instructions slower), but fewer of them is less time.

Needs valgrind (Debian: apt-get install valgrind).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .. import external, procs


@dataclass
class Count:
    pid: int
    role: str  # "gateway", or "shard N"
    instructions: int


def dumped_instructions(path: Path) -> int | None:
    """The instructions a callgrind dump counts (its `summary:` or `totals:` line)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(("summary:", "totals:")):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def role_of(cmdline: list[str]) -> str | None:
    """'shard N' for a shard process (its index follows the module), 'gateway'
    for a gateway, None for anything else in the tree."""
    if "warren.shards.main" in cmdline:
        return f"shard {cmdline[cmdline.index('warren.shards.main') + 1]}"
    if "warren.gateway.cli.main" in cmdline or "warren.gateway.node.worker" in cmdline:
        return "gateway"
    return None


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [part.decode(errors="replace") for part in f.read().split(b"\0") if part]
    except OSError:
        return []


def report(counts: list[Count], messages: int, header: str) -> str:
    """Instructions a message per process and in all, busiest role first after the gateway."""
    lines = [header]
    ordered = sorted(counts, key=lambda c: (c.role != "gateway", c.role))
    width = max((len(f"{c.role} ({c.pid})") for c in ordered), default=5)
    for c in ordered:
        lines.append(f"  {f'{c.role} ({c.pid})':<{width}}  {c.instructions / messages:>10,.0f}")
    total = sum(c.instructions for c in counts)
    lines.append(f"  {'total':<{width}}  {total / messages:>10,.0f}")
    return "\n".join(lines)


def _dump_all(pids: list[int], part: int, folder: Path, deadline: float) -> None:
    """Ask each process for a dump and wait until each has written it (a process
    asleep in a system call dumps when it next wakes)."""
    for pid in pids:
        subprocess.run(["callgrind_control", "-d", str(pid)], capture_output=True, check=False)
    while any(not (folder / f"cg.{pid}.{part}").exists() for pid in pids):
        if time.monotonic() > deadline:
            missing = [pid for pid in pids if not (folder / f"cg.{pid}.{part}").exists()]
            raise SystemExit(f"no callgrind dump from {missing}")
        time.sleep(0.1)


def measure(client: str, scenario: str, rate: float, warmup: float, seconds: float,
            shards: int, keep: str = "") -> tuple[list[Count], int, dict | None]:
    with tempfile.TemporaryDirectory(prefix="warren-instructions-") as tmp:
        folder = Path(tmp)
        port = procs.free_port()
        server = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--trace-children=yes",
             f"--callgrind-out-file={folder}/cg.%p",
             sys.executable, "-m", "warren.gateway.cli.main", "serve", "--port", str(port),
             "--data", str(folder / "data"), "--shards", str(shards),
             "--management-port", "0"],
            stdout=subprocess.DEVNULL, stderr=open(folder / "serve.log", "wb"))
        perf = None
        try:
            if not procs.wait_for_port(port, 300, alive=lambda: server.poll() is None):
                raise SystemExit("the broker did not start under valgrind:\n"
                                 + (folder / "serve.log").read_text(errors="replace")[-2000:])
            url = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
            # It runs past the window and then reports what it saw (a check on the rate).
            argv = external.command(client, url, scenario, warmup + seconds + 5, rate=rate)
            perf = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    text=True)
            time.sleep(warmup)
            pids = [server.pid, *[p for p in procs.process_tree(server.pid) if p != server.pid]]
            roles = {pid: role_of(_cmdline(pid)) for pid in pids}
            pids = [pid for pid in pids if roles[pid] is not None]
            _dump_all(pids, 1, folder, time.monotonic() + 60)
            started = time.monotonic()
            time.sleep(seconds)
            ended = time.monotonic()
            _dump_all(pids, 2, folder, ended + 60)
            counts = [Count(pid, roles[pid], dumped_instructions(folder / f"cg.{pid}.2") or 0)
                      for pid in pids]
            if keep:
                Path(keep).mkdir(parents=True, exist_ok=True)
                for pid in pids:
                    name = f"cg.{pid}.2"
                    shutil.copy(folder / name, Path(keep) / f"{roles[pid].replace(' ', '-')}.{name}")
            out, _ = perf.communicate(timeout=120)
            return counts, round(rate * (ended - started)), external.parse_json_line(out)
        finally:
            if perf is not None and perf.poll() is None:
                perf.kill()
            procs.stop(server, 120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m warren.loadtest.probes.instructions",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--external-client", required=True, metavar="PATH",
                        help="amqp-perf (or a client taking its arguments)")
    parser.add_argument("--scenario", default="transient-autoack")
    parser.add_argument("--rate", type=float, default=50.0, help="messages a second")
    parser.add_argument("--warmup", type=float, default=20.0,
                        help="seconds before the window (valgrind starts slowly)")
    parser.add_argument("--seconds", type=float, default=20.0, help="the window")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--keep", default="", metavar="DIR",
                        help="keep the window's callgrind dumps here (ROLE.cg.PID.2)")
    options = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    counts, messages, result = measure(options.external_client, options.scenario,
                                       options.rate, options.warmup, options.seconds,
                                       options.shards, options.keep)
    print(report(counts, messages,
                 f"instructions a message: {options.scenario} at {options.rate:g}/s, "
                 f"{options.seconds:g} s window ({messages:,} messages)"))
    if result is not None:
        print(f"  (the client: published/s {result.get('published_per_s')}, "
              f"consumed/s {result.get('consumed_per_s')})")


if __name__ == "__main__":
    main()
