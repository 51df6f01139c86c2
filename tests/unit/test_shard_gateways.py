"""A shard serving several gateway processes (issue 19), each over its own pair
of rings: what concerns a gateway reaches that gateway whichever gateway caused
it, credit is counted per ring, and a lost gateway's holdings come back to the
queues while its rings start afresh for the next one. Over a real shard process
(tests/support/shardprocess.py) and in-process."""

from __future__ import annotations

import asyncio
import os
import select
import time

import pytest

from warren.shards import records as r
from warren.shards.codec import decode_events
from warren.shards.gatewayrings import STALLED_AFTER
from warren.shards.persister import Persister
from warren.shards.ring import Ring
from warren.shards.shard import BEHIND_AT
from warren.shards.stats import StatsLog
from warren.storage.queuespec import QueueSpec
from warren.storage.shardstore import ShardStore

from ..support.shardprocess import RingEnd, ShardProcess
from ..support.twins import GATEWAY_RINGS, LINKS, OUTBOXES, SHARDS
from .test_shard_shell import InlineCommitter

TIMEOUT = 10.0
PROPERTIES = b"\x00\x00"


def made_by(gateway: int, n: int) -> int:
    """The n-th id gateway `gateway` makes (gateway.Gateway.new_id)."""
    return n * r.MAX_GATEWAYS + gateway


def create_queue(req: int, qid: int, name: str, durable: bool = False) -> r.CreateQueue:
    spec = QueueSpec("/", name, durable, False, False, {})
    return r.CreateQueue(req, qid, spec, spec.arguments)


def consume(req: int, qid: int, holder: int, channel: int) -> r.Consume:
    return r.Consume(req, qid, holder, channel, f"c{holder}", False, False, 0, 1000)


def publish(qid: int, body: bytes, channel: int = 0, seq: int = 0,
            durable: bool = False) -> r.Publish:
    return r.Publish([qid], "", "q", PROPERTIES, body, durable, channel, seq)


def collect(end: RingEnd, done, got: list | None = None) -> list:
    """Events from `end` until `done(events)` holds (or the deadline: the caller's
    assertion then shows what came)."""
    got = [] if got is None else got
    deadline = time.monotonic() + TIMEOUT
    while not done(got) and time.monotonic() < deadline:
        got += end.receive(0.1)
    return got


def answer(end: RingEnd, req: int, got: list | None = None):
    """The reply to request `req` on this gateway's ring."""
    got = collect(end, lambda events: any(getattr(e, "req", None) == req for e in events
                                          if type(e) is not r.Progress), got)
    (reply,) = [e for e in got if type(e) is not r.Progress and getattr(e, "req", None) == req]
    return reply


def of(kind, events: list) -> list:
    return [e for e in events if type(e) is kind]


@pytest.fixture
def shard_process(tmp_path):
    shard_process = ShardProcess(str(tmp_path), gateways=2, memory_limit=4096)
    yield shard_process
    shard_process.stop()


def test_what_a_gateway_is_sent_follows_its_ids_and_its_ring(shard_process):
    gw0, gw1 = shard_process.ends
    gw0.send([create_queue(1, 1, "q")])
    assert answer(gw0, 1) == r.Reply(1)
    consumer, channel1, channel0 = made_by(1, 1), made_by(1, 2), made_by(0, 1)
    gw1.send([consume(1, 1, consumer, channel1)])  # the same request id as gateway 0's
    assert answer(gw1, 1) == r.Reply(1, consumer_count=1)
    gw0.send([publish(1, b"from 0", channel0, 1)])
    gw1.send([publish(1, b"from 1", channel1, 1)])
    gw0.send([r.QueueInfo(2, [1])])

    events1 = collect(gw1, lambda got: len(of(r.Deliver, got)) == 2 and of(r.Confirmed, got)
                      and r.Progress(2) in got)
    assert sorted(d.body for d in of(r.Deliver, events1)) == [b"from 0", b"from 1"]
    assert {d.holder for d in of(r.Deliver, events1)} == {consumer}
    assert of(r.Confirmed, events1) == [r.Confirmed([channel1], [1])]
    # Progress counts the records of each ring: gateway 1 sent two
    assert [p.records for p in of(r.Progress, events1)][-1] == 2

    events0 = collect(gw0, lambda got: of(r.Confirmed, got) and r.Progress(3) in got)
    assert of(r.Deliver, events0) == []
    assert of(r.Confirmed, events0) == [r.Confirmed([channel0], [1])]
    assert [p.records for p in of(r.Progress, events0)][-1] == 3
    assert of(r.QueueInfoReply, events0)[0].req == 2
    assert of(r.QueueInfoReply, events1) == []


def test_an_alarm_reaches_every_gateway(shard_process):
    gw0, gw1 = shard_process.ends
    gw0.send([create_queue(1, 1, "q")])
    answer(gw0, 1)
    gw1.send([publish(1, b"x" * 8192)])  # over the shard's memory limit (4 KiB)
    for end in shard_process.ends:
        assert r.Alarm("memory", True) in collect(end, lambda got: of(r.Alarm, got))


def shard_sleeps(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "S"


def settles_asleep(pid: int) -> bool:
    """Within the deadline, seen asleep in most of 20 looks at its state, 5 ms
    apart: a shard that spins (a doorbell it never drains ends each wait at once)
    is seen running."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        asleep = 0
        for _ in range(20):
            asleep += shard_sleeps(pid)
            time.sleep(0.005)
        if asleep >= 15:
            return True
    return False


def test_a_woken_shard_sleeps_again_once_its_work_is_done(shard_process):
    gw0, gw1 = shard_process.ends
    gw0.send([create_queue(1, 1, "q")])
    answer(gw0, 1)
    for req in (2, 3):  # each a wake by the doorbell, drained before the next wait
        gw1.send([r.QueueInfo(req, [1])])
        assert answer(gw1, req).queues[0][0] == 1
        assert settles_asleep(shard_process.process.pid)


def test_a_shard_whose_only_gateway_reads_nothing_waits_for_it_asleep(tmp_path):
    shard_process = ShardProcess(str(tmp_path))
    try:
        (gw,) = shard_process.ends
        gw.send([create_queue(1, 1, "q"), consume(2, 1, made_by(0, 1), made_by(0, 2))])
        body = b"x" * (1 << 20)
        for _ in range(14):  # most of what its event ring holds, and it reads none of it
            gw.send([publish(1, body)])
        assert settles_asleep(shard_process.process.pid)
        for _ in range(4):  # woken by the doorbell for more than the ring has room for
            gw.send([publish(1, body)])
        assert settles_asleep(shard_process.process.pid)  # blocked on the full ring, not spinning
        assert len(of(r.Deliver, collect(gw, lambda got: len(of(r.Deliver, got)) == 18))) == 18
    finally:
        shard_process.stop()


def test_a_sleeping_shard_wakes_for_the_second_gateways_ring(shard_process):
    gw0, gw1 = shard_process.ends
    gw0.send([create_queue(1, 1, "q")])
    answer(gw0, 1)
    deadline = time.monotonic() + TIMEOUT
    while not shard_sleeps(shard_process.process.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    for req in (1, 2):  # and again, after it slept once more
        gw1.send([r.QueueInfo(req, [1])])
        assert answer(gw1, req).queues[0][0] == 1  # well before its 60 s statistics wake-up


def test_a_gateway_that_reads_nothing_holds_up_only_itself(shard_process):
    gw0, gw1 = shard_process.ends
    gw0.send([create_queue(1, 1, "q")])
    answer(gw0, 1)
    gw1.send([consume(1, 1, made_by(1, 1), made_by(1, 2))])
    body = b"x" * (1 << 20)
    for _ in range(24):  # more than gateway 1's event ring holds, and it reads none of it
        gw0.send([publish(1, body)])
    gw0.send([create_queue(2, 2, "q2")])
    assert answer(gw0, 2) == r.Reply(2)
    assert settles_asleep(shard_process.process.pid)  # waiting for gateway 1, without spinning
    gw0.send([r.GatewayLost(3, 1)])  # had it died: its report is read
    assert answer(gw0, 3) == r.Reply(3)


def test_a_lost_gateways_messages_come_back_and_its_rings_serve_the_next_one(shard_process):
    gw0, gw1 = shard_process.ends
    gw0.send([create_queue(1, 1, "q", durable=True)])
    answer(gw0, 1)
    lost_consumer, lost_channel = made_by(1, 1), made_by(1, 2)
    gw1.send([consume(1, 1, lost_consumer, lost_channel)])
    answer(gw1, 1)
    gw0.send([publish(1, b"m%d" % i) for i in range(3)])
    assert len(of(r.Deliver, collect(gw1, lambda got: len(of(r.Deliver, got)) == 3))) == 3
    # unacked by gateway 1, which then dies with confirms outstanding
    gw1.send([publish(1, b"late", lost_channel, seq, durable=True) for seq in (1, 2, 3)])
    gw0.send([r.GatewayLost(2, 1)])
    assert answer(gw0, 2) == r.Reply(2)

    consumer0 = made_by(0, 1)
    gw0.send([consume(3, 1, consumer0, made_by(0, 2))])
    got = collect(gw0, lambda got: len(of(r.Deliver, got)) >= 3)
    first = of(r.Deliver, got)[:3]
    assert [(d.body, d.redelivered, d.holder) for d in first] == \
        [(b"m%d" % i, True, consumer0) for i in range(3)]

    fresh = RingEnd(Ring.attach(gw1.commands.spec()), Ring.attach(gw1.events.spec()))
    try:
        consumer1, channel1 = made_by(1, 1), made_by(1, 2)  # a new process counts anew
        fresh.send([create_queue(1, 2, "q2"), consume(2, 2, consumer1, channel1)])
        fresh.send([publish(2, b"fresh", channel1, 101)])
        events = collect(fresh, lambda got: of(r.Deliver, got) and of(r.Confirmed, got))
        assert [d.body for d in of(r.Deliver, events)] == [b"fresh"]
        assert of(r.Confirmed, events) == [r.Confirmed([channel1], [101])]  # none of the dead one's
        assert events[0] == r.Reply(1)  # nothing of the dead gateway's went before
        assert r.Progress(2) in events  # its records are counted from the reset
    finally:
        fresh.commands.close()
        fresh.events.close()


# -- in-process ----------------------------------------------------------------


@pytest.fixture(params=SHARDS)  # pure, and compiled
def shard(tmp_path, request):
    store = ShardStore(str(tmp_path / "shard-0"), 1 << 26)
    shard = request.param(0, Persister({0: store}, 0), StatsLog(str(tmp_path / "logs"), 0), gateways=2)
    shard.run(create_queue(1, 5, "d", durable=True), 0.0)
    shard.take_events()
    yield shard
    store.close()


def test_a_lost_gateways_confirms_go_nowhere_whichever_commit_carries_them(shard):
    outbox = shard.outbox
    ours, theirs = made_by(0, 1), made_by(1, 1)
    outbox.origin = 1
    shard.run(publish(5, b"a", theirs, 1, durable=True), 0.0)
    outbox.origin = 0
    shard.run(publish(5, b"b", ours, 1, durable=True), 0.0)
    committer = InlineCommitter()
    shard.start_commit(committer, 0.0)  # both ride on the commit in flight
    outbox.origin = 1
    shard.run(publish(5, b"c", theirs, 2, durable=True), 0.0)  # gathers for the next
    shard.run(r.QueueStatus(7, 5), 0.0)  # answered to gateway 1 ...
    outbox.origin = 0
    shard.run(r.GatewayLost(9, 1), 0.0)
    for origin, lost in shard.take_lost():  # ... which dies before the answer leaves
        shard.gateway_lost(origin, lost, 0.0)
    assert shard.take_events() == [[r.Reply(9)], []]
    committer.run()
    assert shard.finish_commit() == [r.Confirmed([ours], [1])]
    assert shard.commit_now(0.0) == []
    assert shard.queues[5].ready_count == 3  # its messages stay: they were published


def test_the_gateway_replacing_a_lost_one_hears_of_the_alarms_in_force(shard):
    shard.run(publish(5, b"x" * 100), 0.0)
    shard.check_resources(memory_limit=10, stored=True)
    assert shard.take_events() == [[r.Alarm("memory", True)]] * 2
    shard.run(r.GatewayLost(2, 1), 0.0)
    for origin, lost in shard.take_lost():
        shard.gateway_lost(origin, lost, 0.0)
    assert shard.take_events() == [[r.Reply(2)], [r.Alarm("memory", True)]]


def test_losing_no_such_gateway_is_refused(shard):
    shard.run(r.GatewayLost(3, 0), 0.0)  # gateway 0 cannot lose itself
    shard.run(r.GatewayLost(4, 2), 0.0)
    assert shard.take_events()[0] == [r.Reply(3, r.Refusal.FAILED), r.Reply(4, r.Refusal.FAILED)]
    assert shard.take_lost() == []


@pytest.mark.parametrize("outbox_class", OUTBOXES)
def test_events_go_to_the_gateway_they_concern(outbox_class):
    outbox = outbox_class(3)
    outbox.origin = 2
    outbox.add(r.Reply(1))
    outbox.add(r.Deliver(made_by(1, 7), 5, 1, False, "", "q", b"", b"x"))
    outbox.add(r.ConsumerCancelled(made_by(0, 7), 5))
    outbox.add(r.Alarm("memory", True))
    outbox.add(r.PublishCost(5, 2))  # every gateway's publishers feed the queue
    outbox.add(r.DeadLettered(5, 1, "expired", None, None, None, None))
    everyone = [r.Alarm("memory", True), r.PublishCost(5, 2)]
    assert outbox.take() == [
        [r.ConsumerCancelled(made_by(0, 7), 5), *everyone,
         r.DeadLettered(5, 1, "expired", None, None, None, None)],
        [r.Deliver(made_by(1, 7), 5, 1, False, "", "q", b"", b"x"), *everyone],
        [r.Reply(1), *everyone]]
    a, b, c = made_by(0, 1), made_by(2, 1), made_by(0, 2)
    assert outbox.route([r.Confirmed([a, b, c], [1, 2, 3]), r.Rejected([b], [4])]) == [
        [r.Confirmed([a, c], [1, 3])], [], [r.Confirmed([b], [2]), r.Rejected([b], [4])]]


# -- the gateway's end ---------------------------------------------------------


@pytest.mark.parametrize("link_class", LINKS)
def test_a_link_makes_rings_for_every_gateway_and_removes_them(tmp_path, link_class):
    async def scenario() -> list[str]:
        link = link_class(0, str(tmp_path), [0], 0, 60.0, 1 << 26, lambda *a: None,
                         lambda *a: None, gateways=2)
        link.start()
        names = [spec.shm_name for k in range(2)
                 for spec in (link.rings_for(k).commands, link.rings_for(k).events)]
        end = RingEnd(Ring.attach(link.rings_for(1).commands), Ring.attach(link.rings_for(1).events))
        try:
            replies = []
            link.request(lambda req: r.QueueInfo(req, []), replies.append)
            end.send([create_queue(1, 1, "q")])
            deadline = time.monotonic() + TIMEOUT
            got: list = []
            while not (replies and r.Reply(1) in got) and time.monotonic() < deadline:
                got += end.receive(0.01)
                await asyncio.sleep(0.01)
            assert r.Reply(1) in got and type(replies[0]) is r.QueueInfoReply
        finally:
            end.commands.close()
            end.events.close()
            await link.stop()
        return names

    names = asyncio.run(scenario())
    assert len(set(names)) == 4
    assert not any(os.path.exists(f"/dev/shm/{name}") for name in names)


# -- credit across gateways (gatewayrings.py) ------------------------------------


class Rings:
    """A shard's GatewayRings over in-process rings, with each gateway's ends."""

    def __init__(self, gateways: int, classes: tuple):
        rings_class, outbox_class = classes
        self.commands = [Ring.create(1 << 16) for _ in range(gateways)]
        self.events = [Ring.create(1 << 16) for _ in range(gateways)]
        self.shard = rings_class([r.RingPair(c.spec(), e.spec())
                                  for c, e in zip(self.commands, self.events)])
        self.outbox = outbox_class(gateways)

    def deliver_to(self, gateway: int) -> None:
        """A turn's delivery for `gateway`, written to its event ring."""
        self.outbox.put(gateway, [r.Deliver(made_by(gateway, 1), 1, 1, False, "", "q", b"",
                                            b"x")])
        self.shard.write(self.outbox)

    def progress(self, gateway: int, now: float) -> list[int]:
        """The Progress the shard sends `gateway` after its next write, as it would."""
        self.shard.write(self.outbox)
        if self.shard.holding():
            self.shard.pass_credit(self.outbox, now)
        self.outbox.put_each(self.outbox.take())
        self.shard.write(self.outbox)
        return [e.records for batch in self.events[gateway].read_many()
                for e in decode_events(batch) if type(e) is r.Progress]

    def close(self) -> None:
        for ring in self.commands + self.events:
            ring.close()
            ring.unlink()


@pytest.fixture(params=[(rings.values[0], outbox.values[0])
                        for rings, outbox in zip(GATEWAY_RINGS, OUTBOXES)],
                ids=[rings.id for rings in GATEWAY_RINGS])
def plumbing(request) -> tuple:
    """GatewayRings and Outbox: both pure, then both compiled."""
    return request.param


@pytest.fixture
def rings(plumbing):
    made = Rings(2, plumbing)
    yield made
    made.close()


def test_credit_comes_at_once_while_no_queue_is_behind(rings):
    rings.deliver_to(1)  # unread by gateway 1
    rings.shard.worked(0, 3, rings.outbox, behind=False)
    assert rings.progress(0, 0.0) == [3]


def test_credit_for_a_queue_behind_waits_until_the_other_gateway_read_its_deliveries(rings):
    rings.deliver_to(1)
    rings.shard.worked(0, 3, rings.outbox, behind=True)
    assert rings.progress(0, 0.0) == []
    rings.deliver_to(1)  # written after the credit: not waited for
    rings.shard.worked(0, 2, rings.outbox, behind=False)  # behind the held credit, in order
    assert rings.progress(0, 0.1) == []
    rings.events[1].read_many(max_records=1)  # gateway 1 takes in the first delivery
    assert rings.progress(0, 0.2) == [3]
    rings.events[1].read_many()
    assert rings.progress(0, 0.3) == [5]
    assert not rings.shard.holding()


def test_credit_waits_only_for_other_gateways_and_for_no_stuck_one(rings):
    rings.deliver_to(0)  # its own unread events never hold a gateway's credit
    rings.deliver_to(1)
    rings.shard.worked(0, 1, rings.outbox, behind=True)
    assert rings.progress(0, 10.0) == []
    assert rings.progress(0, 10.0 + STALLED_AFTER / 2) == []
    # gateway 1 reads nothing for STALLED_AFTER: stuck, and waited for no more
    assert rings.progress(0, 10.0 + STALLED_AFTER) == [1]


def test_a_lost_gateway_holds_no_credit(rings):
    rings.deliver_to(1)
    rings.shard.worked(0, 1, rings.outbox, behind=True)
    rings.shard.worked(1, 4, rings.outbox, behind=True)
    assert rings.progress(0, 0.0) == []
    rings.shard.reset(1)  # gateway 1 died: its ring starts again, and so does its count
    assert rings.progress(0, 0.1) == [1]
    assert not rings.shard.holding()


def test_with_one_gateway_credit_is_never_held(plumbing):
    one = Rings(1, plumbing)
    try:
        one.deliver_to(0)
        one.shard.worked(0, 2, one.outbox, behind=True)
        assert one.progress(0, 0.0) == [2]
    finally:
        one.close()


def test_a_shard_sleeping_on_held_credit_wakes_when_the_other_gateway_reads(rings):
    rings.deliver_to(1)
    rings.shard.worked(0, 1, rings.outbox, behind=True)
    assert rings.progress(0, 0.0) == []
    (fd,) = rings.shard.read_waits()
    rings.events[1].read_many()
    assert select.select([fd], [], [], 5.0)[0] == [fd]
    rings.shard.clear_space()
    assert rings.progress(0, 0.1) == [1]


def test_a_publish_into_a_queue_whose_consumers_are_behind_marks_its_gateway(shard):
    shard.run(create_queue(2, 6, "behind"), 0.0)
    shard.run(create_queue(3, 7, "buffer"), 0.0)  # no consumer: a buffer, never behind
    consumer = r.Consume(4, 6, made_by(1, 1), made_by(1, 2), "c", True, False, 0, 0)  # no credit
    shard.run(consumer, 0.0)
    shard.outbox.origin = 0
    for _ in range(BEHIND_AT - 1):
        shard.run(publish(6, b"m"), 0.0)
        shard.run(publish(7, b"m"), 0.0)
    assert shard.behind == set()
    shard.outbox.origin = 1
    shard.run(publish(7, b"m"), 0.0)
    assert shard.behind == set()
    shard.run(publish(6, b"m"), 0.0)
    assert shard.behind == {1}
