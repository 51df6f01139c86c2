"""The shard process: a thin I/O shell around its state machine (shard.py).

One loop turn: read every command batch waiting in the command rings (one per
gateway process), apply them to the queues, then carry out the effects in one
go: storage writes, then events (deliveries, replies, confirms) to each gateway
in one ring write and one doorbell. The logic lives elsewhere: what commands do
and which effects they have (shard.py), the queues (queue.py), which confirms
wait for which commit (groupcommit.py), what goes to which gateway in which order
(outbox.py), the gateways' rings (gatewayrings.py) and when queues have timed
work (timers.py).

When the command rings are empty the shard sleeps on their shared doorbell;
when a gateway's event ring is full it stops reading that gateway's commands,
which is the backpressure the gateway feels. Started by the gateway as
`python -m warren.shards.main INDEX`, its ShardSpec on stdin. pip install compiles this module as it
is (warren.shards._main, its loop typed by _main.pxd), and main() runs that
build's loop where there is one (shards/build.py).
"""

from __future__ import annotations

import logging
import os
import select
import sys
from time import monotonic  # a name of its own: a compiled turn calls it bare

import msgspec

from warren.gateway.io.children import read_spec
from warren.storage.shardstore import ShardStore

from . import build, logsetup
from .committer import Committer
from .gatewayrings import STALLED_AFTER
from .gatewayrings import GatewayRings as PureGatewayRings
from .malloc import keep_freed_memory
from .persister import Persister

# Records by name: a compiled module would look each up in `records` at every use.
from .records import PUBLISH_CREDIT, Progress, ShardSpec, credit_cost
from .shard import Shard as PureShard
from .stats import StatsLog

GatewayRings = build.twin(PureGatewayRings, "warren.shards._gatewayrings", "GatewayRings")
Shard = build.twin(PureShard, "warren.shards._shard", "Shard")

UNMAP_INTERVAL = 1.0  # seconds between drops of the stores' mapped pages under load
log = logging.getLogger("warren.shard")


def before_commit(events: list, credit: int) -> tuple[list, list]:
    """A turn's events split into those to send before a commit made in the loop's
    own thread and those to send with its confirms. Replies and deliveries go
    first; credit alone (Progress) waits, sparing the gateway a wake-up, unless
    the turn's publishes spent enough of it (`credit` units) that a publisher
    may be waiting for it while the commit runs."""
    if credit <= PUBLISH_CREDIT // 2 and all(type(e) is Progress for e in events):
        return [], events
    return events, []


def serve(spec: ShardSpec) -> None:
    rings = GatewayRings(spec.gateways)
    stores = {k: ShardStore(os.path.join(spec.data_dir, f"shard-{k}"), spec.store_map_size)
              for k in spec.stores}
    stats = StatsLog(spec.log_dir or os.path.join(spec.data_dir, "logs"), spec.index,
                     spec.stats_interval)
    shard = Shard(spec.index, Persister(stores, spec.index), stats, len(spec.gateways))
    committer = Committer(Persister.run_commit)
    poller = select.poll()
    poller.register(rings.doorbell, select.POLLIN)
    poller.register(spec.lifeline_fd, select.POLLIN)
    poller.register(committer.done_fd, select.POLLIN)
    outbox, timers, commits = shard.outbox, shard.timers, shard.commits
    lifeline, memory_limit = spec.lifeline_fd, spec.memory_limit
    unmap_at = 0.0

    # At a steady rate a turn handles a message or two, and most of its CPU goes to
    # the Python functions it runs, each costing most the first time a turn touches
    # it (the caches are cold after the sleep): so the loop asks before it calls
    # what usually has nothing to do (timers, stats, the rings' rarer states).
    while shard.running:
        rings.write(outbox)
        if any(rings.held):  # rings.holding()
            rings.pass_credit(outbox, monotonic())
        if rings.blocked and rings.all_blocked():
            fds = rings.space_fds()
            if fds is not None:
                rings.drain_doorbell()
                _wait(poller, fds, lifeline)
                rings.clear_space()
            continue
        if commits.inflight is not None and committer.finished():
            outbox.put_routed(shard.finish_commit())
            shard.check_resources(memory_limit, shard.stored_ok)
            outbox.put_each(shard.take_events())
            rings.write(outbox)  # the confirms go now, not behind the next turn's work
        got = rings.read()
        now = monotonic()
        next_timer = timers.next_deadline() if timers.heap else None
        timers_due = next_timer is not None and next_timer <= now
        if not got and not timers_due:
            if commits.inflight is None and shard.has_commit_work(now):
                # what gathered while the last commit ran goes now
                outbox.put_routed(shard.start_commit(committer, now))
                continue
            if any(outbox.records) and rings.unsent(outbox):  # put after the top's write
                continue
            if now >= stats.next_at:
                stats.tick(now, shard.queues.values(), commits)
            if rings.sleep():
                # Wake for commands, the end of a commit, room for a blocked gateway's
                # events, a gateway reading what held credit waits for, at least once
                # an interval (an idle shard still logs), and in time for the next
                # queue timer.
                timeout = spec.stats_interval
                if next_timer is not None:
                    timeout = max(0.0, min(timeout, next_timer - now))
                if not rings.blocked and not any(rings.held):  # a steady turn's sleep
                    _wait(poller, (), lifeline, timeout)
                else:
                    fds = rings.space_fds()
                    reads = rings.read_waits() if fds is not None and rings.holding() else []
                    if fds is not None and reads is not None:
                        if rings.holding():  # and to see a gateway that stopped reading
                            timeout = min(timeout, STALLED_AFTER)
                        _wait(poller, fds + reads, lifeline, timeout)
                        rings.clear_space()
                rings.woke()
            continue
        for gateway, batches in got:
            outbox.origin = gateway  # replies go back where their requests came from
            for batch in batches:  # (a run of acks is one Settle already: ShardLink.send)
                shard.run_all(batch, now)
        for gateway, batches in got:
            # Credit back for the publishes in these records, behind this turn's
            # deliveries: a shard that is behind returns credit later.
            rings.worked(gateway, len(batches), outbox, gateway in shard.behind)
        shard.behind.clear()
        if shard.costs:
            shard.reprice()
        if shard.lost:
            for origin, lost in shard.take_lost():
                shard.gateway_lost(origin, lost, now)
                rings.reset(lost.gateway)
        if timers_due:  # one that this turn's commands set, due now, runs next pass
            shard.run_timers(now)
        # Deliveries and replies go out at once; confirms only once their commit is
        # durable. A commit runs in the committer thread while this loop goes on:
        # what arrives meanwhile gathers into the next one (group commit).
        turn = shard.take_events()
        if commits.inflight is None and not shard.holder_queues and rings.is_empty():
            # Nothing else to do meanwhile and nobody to deliver to: commit here,
            # sparing a lone publisher the two thread hand-offs. With consumers,
            # deliveries never wait for an fsync.
            spent = _credit_spent(got)
            early_any = False
            for gateway, events in enumerate(turn):
                early, turn[gateway] = before_commit(events, spent.get(gateway, 0))
                if early:
                    outbox.put(gateway, early)
                    early_any = True
            if early_any:
                rings.write(outbox)
            confirms = outbox.route(shard.commit_now(now))
            for gateway, events in enumerate(turn):
                outbox.put(gateway, events + confirms[gateway])
            rings.write(outbox)  # the publisher waits for these: before the bookkeeping
        else:
            outbox.put_each(turn)
            if commits.inflight is None and shard.has_commit_work(now):
                outbox.put_routed(shard.start_commit(committer, now))
            # The turn's events go now, before the bookkeeping below: one ring write,
            # at most one doorbell, per gateway. (A delivery's wait here also moves
            # how often a client that paces its publishes by the clock writes:
            # docs/architecture.md.)
            rings.write(outbox)
        if shard.check_resources(memory_limit, shard.stored_ok):
            outbox.put_each(shard.take_events())  # the alarm it raised or cleared
        if now >= stats.next_at:
            stats.tick(now, shard.queues.values(), commits)
        if now >= unmap_at:  # the store's mapped pages are page cache, not ours to hold
            shard.persister.drop_mapped_pages()
            unmap_at = now + UNMAP_INTERVAL

    if commits.inflight is not None:  # finish the commit in flight, then what is left
        committer.wait()
        committer.finished()
        outbox.put_routed(shard.finish_commit())
    outbox.put_routed(shard.commit_now())
    outbox.put_each(shard.take_events())
    committer.close()
    while True:  # hand over the last events before exiting
        rings.write(outbox)
        if not rings.blocked:
            break
        fds = rings.space_fds()
        if fds is not None:
            rings.drain_doorbell()
            _wait(poller, fds, spec.lifeline_fd)
            rings.clear_space()
    shard.persister.close()
    stats.tick(monotonic(), shard.queues.values(), commits, force=True)
    stats.close()


def _credit_spent(got: list) -> dict[int, int]:
    """The credit each gateway's commands of this turn spent (credit_cost). (Not
    inline: Cython compiles no closure, a generator's, inside the typed loop.)"""
    spent = {}
    for gateway, batches in got:
        spent[gateway] = sum([credit_cost(cmd) for batch in batches for cmd in batch])
    return spent


def _wait(poller: select.poll, extra_fds, lifeline_fd: int,
          timeout: float | None = None) -> None:
    """Block until a registered fd (or one of `extra_fds`) is readable or `timeout`
    seconds pass; exit if the gateway died."""
    for fd in extra_fds:
        poller.register(fd, select.POLLIN)
    try:
        ready = poller.poll(None if timeout is None else timeout * 1000)
    finally:
        for fd in extra_fds:
            poller.unregister(fd)
    for fd, _ in ready:
        if fd == lifeline_fd:
            sys.exit(0)


def main() -> None:
    # Ctrl-C, systemd and `timeout` signal the whole process group: read_spec
    # ignores them, the gateway decides when shards stop (after draining), and a
    # dead gateway is seen on the lifeline pipe.
    spec = msgspec.json.decode(read_spec(), type=ShardSpec)
    keep_freed_memory()
    logsetup.configure(spec.log, f"shard-{spec.index}")
    log.info("shard %d starting on stores %s", spec.index,
             ", ".join(f"shard-{k}" for k in spec.stores))
    os.set_blocking(spec.lifeline_fd, False)
    build.twin(serve, "warren.shards._main", "serve")(spec)


if __name__ == "__main__":
    main()
