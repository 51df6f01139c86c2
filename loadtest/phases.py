"""A benchmark phase: publishers and consumers, each in its own process (fork) on the fast
client, started together on a signal; while they run, the broker's memory and CPU are
sampled from /proc; then the phase's figures (rates, latency percentiles)."""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_module
import time
import traceback
from array import array
from types import SimpleNamespace
from typing import Any

from .fastclient import AMQPError, FastClient, Publisher
from .procs import cpu_seconds, process_tree, tree_cpu, tree_memory
from .targets import Target


def _client_process(role: str, spec: dict, shared: SimpleNamespace, results, prepare,
                    measure) -> None:
    """A client process's life: connect, `prepare` (its channel), report ready, wait for the
    go, `measure`, and report the stats, or the error, to the parent."""
    pair = spec["pair"]
    client = None
    try:
        client = FastClient(spec["url"], timeout=spec["io_timeout"], name=f"bench-{role}-{pair}")
        prepared = prepare(client)
        results.put(("ready", role, pair, None))
        if not shared.go.wait(spec["setup_timeout"]) or shared.abort.is_set():
            raise TimeoutError("never told to go")
        stats = measure(client, prepared)
        client.close()
        client = None
        stats["cpu_s"] = cpu_seconds()
        results.put(("result", role, pair, stats))
    except BaseException as error:  # noqa: BLE001 - reported to the parent
        if role == "pub":
            shared.pub_done[pair] = 1  # its consumer waits for no more
        results.put(("error", role, pair, _describe(error)))
    finally:
        if client is not None:
            client.abort()


def _publisher_child(spec: dict, shared: SimpleNamespace, results) -> None:
    pair = spec["pair"]

    def prepare(client: FastClient) -> Publisher:
        channel = client.open_channel()
        if spec["confirm_window"]:
            client.confirm_select(channel)
        return Publisher(channel, "", spec["queue"], spec["body"], spec["persistent"],
                         client.frame_max)

    def measure(client: FastClient, publisher: Publisher) -> dict:
        delivered = shared.delivered
        published = shared.published

        def on_published(count: int) -> None:
            published[pair] = count

        stats = client.publish_loop(
            publisher, duration=spec["duration"], limit=spec["limit"],
            confirm_window=spec["confirm_window"], batch=spec["batch"],
            lag=(lambda sent: sent - delivered[pair]) if spec["max_lag"] else None,
            max_lag=spec["max_lag"], should_stop=shared.abort.is_set,
            confirm_timeout=spec["drain_timeout"], on_published=on_published,
            rate=spec.get("rate") or 0.0)
        published[pair] = stats["published"]
        shared.pub_done[pair] = 1
        stats["confirm_latency_us"] = stats["confirm_latency_us"].tobytes()
        return stats

    _client_process("pub", spec, shared, results, prepare, measure)


def _consumer_child(spec: dict, shared: SimpleNamespace, results) -> None:
    pair = spec["pair"]

    def prepare(client: FastClient) -> int:
        channel = client.open_channel()
        if spec["prefetch"]:
            client.qos(channel, spec["prefetch"])
        client.consume(channel, spec["queue"], no_ack=spec["no_ack"])
        return channel

    def measure(client: FastClient, channel: int) -> dict:
        published, delivered, pub_done = shared.published, shared.delivered, shared.pub_done
        abort = shared.abort

        def should_stop(count: int) -> bool:
            return (pub_done[pair] and count >= published[pair]) or abort.is_set()

        def on_delivered(count: int) -> None:
            delivered[pair] = count

        stats = client.consume_loop(channel, no_ack=spec["no_ack"], ack_every=spec["ack_every"],
                                    should_stop=should_stop,
                                    deadline=time.monotonic() + spec["consume_timeout"],
                                    on_delivered=on_delivered)
        stats["e2e_latency_us"] = stats["e2e_latency_us"].tobytes()
        return stats

    _client_process("con", spec, shared, results, prepare, measure)


def _describe(error: BaseException) -> str:
    if isinstance(error, AMQPError):
        return f"{type(error).__name__}: {error}"
    return f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=3)}"


def run_phase(target: Target, pairs: list[dict], *, duration: float | None, limit: int | None,
              drain_timeout: float, hard_timeout: float) -> dict[str, Any]:
    """Run publishers and consumers of `pairs` (each: queue, pub spec or None, con spec or
    None, expected = messages already there for a consumer-only pair) and collect stats."""
    ctx = mp.get_context("fork")
    n = len(pairs)
    shared = SimpleNamespace(published=ctx.RawArray("q", n), delivered=ctx.RawArray("q", n),
                             pub_done=ctx.RawArray("b", n), go=ctx.Event(), abort=ctx.Event())
    results = ctx.Queue()
    common = {"url": target.url, "io_timeout": 30.0, "setup_timeout": 60.0,
              "drain_timeout": drain_timeout, "duration": duration, "limit": limit}
    processes = []
    for index, pair in enumerate(pairs):
        if pair.get("pub") is None:
            shared.published[index] = pair.get("expected", 0)
            shared.pub_done[index] = 1
        if pair.get("con") is not None:
            spec = dict(common, **pair["con"], pair=index, queue=pair["queue"],
                        consume_timeout=(duration or 0) + drain_timeout + (
                            hard_timeout if duration is None else 0))
            processes.append(ctx.Process(target=_consumer_child, args=(spec, shared, results),
                                         name=f"bench-con-{index}", daemon=True))
    for index, pair in enumerate(pairs):
        if pair.get("pub") is not None:
            spec = dict(common, **pair["pub"], pair=index, queue=pair["queue"])
            processes.append(ctx.Process(target=_publisher_child, args=(spec, shared, results),
                                         name=f"bench-pub-{index}", daemon=True))
    for process in processes:
        process.start()

    stats: dict[tuple[str, int], dict] = {}
    errors: list[str] = []
    ready = 0
    setup_deadline = time.monotonic() + 60
    root = target.root_pid()
    tree = process_tree(root) if root else []
    rss_peak = pss_peak = 0.0
    cpu_before = tree_cpu(tree) if tree else None
    wall_before = time.monotonic()
    t0 = None
    hard_deadline = None
    last_sample = 0.0
    finished = 0
    try:
        while finished < len(processes):
            now = time.monotonic()
            if t0 is None and (ready == len(processes) or errors):
                if errors:
                    shared.abort.set()
                t0 = time.time()
                hard_deadline = now + hard_timeout
                shared.go.set()
            if t0 is None and now > setup_deadline:
                errors.append("clients did not get ready within 60 s")
                shared.abort.set()
                shared.go.set()
                t0 = time.time()
                hard_deadline = now + 10
            if hard_deadline is not None and now > hard_deadline:
                if not shared.abort.is_set():
                    errors.append(f"hard timeout ({hard_timeout:.0f} s) reached")
                    shared.abort.set()
                    hard_deadline = now + 10
                else:
                    break
            if tree and now - last_sample >= 0.5:
                last_sample = now
                rss, pss = tree_memory(tree)
                rss_peak, pss_peak = max(rss_peak, rss), max(pss_peak, pss)
            try:
                kind, role, pair, payload = results.get(timeout=0.2)
            except queue_module.Empty:
                if not any(p.is_alive() for p in processes):
                    # Give the queue's feeder a last chance, then stop waiting.
                    try:
                        kind, role, pair, payload = results.get(timeout=1.0)
                    except queue_module.Empty:
                        errors.append("client processes exited without reporting")
                        break
                else:
                    continue
            if kind == "ready":
                ready += 1
            elif kind == "result":
                stats[(role, pair)] = payload
                finished += 1
            else:
                errors.append(f"{role} {pair}: {payload}")
                finished += 1
                shared.abort.set()
                shared.go.set()
    finally:
        shared.abort.set()
        shared.go.set()
        for process in processes:
            process.join(5)
            if process.is_alive():
                process.terminate()
                process.join(5)
        results.close()
    cpu_after = tree_cpu(tree) if tree else None
    wall = time.monotonic() - wall_before
    if tree:
        rss, pss = tree_memory(process_tree(root))
        rss_peak, pss_peak = max(rss_peak, rss), max(pss_peak, pss)
    return {"stats": stats, "errors": errors, "t0": t0 or time.time(),
            "broker_rss_mb": rss_peak or None, "broker_pss_mb": pss_peak or None,
            "broker_cpu_s": (cpu_after - cpu_before) if cpu_before is not None else None,
            "wall_s": wall}


def _percentiles(chunks: list[bytes]) -> tuple[float | None, float | None]:
    samples = array("q")
    for chunk in chunks:
        samples.frombytes(chunk)
    if not samples:
        return None, None
    ordered = sorted(samples)
    last = len(ordered) - 1
    return ordered[int(0.50 * last)] / 1000, ordered[int(0.99 * last)] / 1000


def summarize(phase: dict) -> dict[str, Any]:
    """Figures of a phase: totals, rates over the phase's window, percentiles."""
    t0 = phase["t0"]
    pubs = [s for (role, _), s in phase["stats"].items() if role == "pub"]
    cons = [s for (role, _), s in phase["stats"].items() if role == "con"]
    published = sum(s["published"] for s in pubs)
    confirmed = sum(s["confirmed"] for s in pubs)
    delivered = sum(s["delivered"] for s in cons)
    row: dict[str, Any] = {
        "published": published, "confirmed": confirmed,
        "nacked": sum(s["nacked"] for s in pubs), "delivered": delivered,
        "published_per_s": None, "confirmed_per_s": None, "delivered_per_s": None,
    }
    if pubs and published:
        window = max(s["t_end_publish"] for s in pubs) - t0
        row["published_per_s"] = published / window if window > 0 else None
        row["publish_seconds"] = round(window, 3)
    if pubs and confirmed:
        window = max(s["t_last_confirm"] for s in pubs) - t0
        row["confirmed_per_s"] = confirmed / window if window > 0 else None
    if cons and delivered:
        window = max(s["t_last"] for s in cons if s["delivered"]) - t0
        row["delivered_per_s"] = delivered / window if window > 0 else None
        row["deliver_seconds"] = round(window, 3)
    row["e2e_p50_ms"], row["e2e_p99_ms"] = _percentiles([s["e2e_latency_us"] for s in cons])
    row["confirm_p50_ms"], row["confirm_p99_ms"] = _percentiles(
        [s["confirm_latency_us"] for s in pubs])
    row["broker_rss_mb"] = phase["broker_rss_mb"]
    row["broker_pss_mb"] = phase["broker_pss_mb"]
    row["broker_cpu_s"] = phase["broker_cpu_s"]
    row["broker_wall_s"] = round(phase["wall_s"], 3)
    row["client_cpu_s"] = sum(s["cpu_s"] for s in pubs + cons)
    row["publisher_blocked_s"] = round(sum(s.get("blocked_s", 0.0) for s in pubs), 3)
    return row
