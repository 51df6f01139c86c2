"""How a relay renames ids (gateway/cluster/idmap.py): an id of another node
becomes one of the relay's slot and comes back as it was, to the link it came
in on; a command's ids are renamed field by field, and a shard's events go back
renamed to the senders they concern."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from warren.gateway.cluster import idmap
from warren.shards import records as r

ids = st.integers(0, 1 << 40)
nodes = st.integers(1, 63)
slots = st.integers(0, 63)
SLOT = 5


@given(ids, nodes, slots)
def test_an_id_round_trips_and_names_its_sender(ident, node, slot):
    local = idmap.to_local(ident, node, slot)
    assert r.gateway_of(local) == slot  # the shard sends its events to the relay
    assert idmap.to_remote(local) == ident
    assert idmap.sender_of(local) == (node, r.gateway_of(ident))


@given(st.tuples(ids, nodes), st.tuples(ids, nodes), slots)
def test_ids_of_different_nodes_or_makers_never_meet(one, other, slot):
    if one != other:
        assert idmap.to_local(*one, slot) != idmap.to_local(*other, slot)


def local(ident: int, node: int = 3) -> int:
    return idmap.to_local(ident, node, SLOT)


def test_a_consume_makes_a_holder_on_its_mapped_channel():
    record = r.Consume(9, 1, 129, 65, "ctag", False, False, 10, 10)
    assert idmap.map_command(record, 3, SLOT) == local(129)
    assert (record.holder, record.channel, record.req) == (local(129), local(65), 9)


def test_a_get_makes_its_channel_a_holder():
    record = r.Get(9, 1, 65, False)
    assert idmap.map_command(record, 3, SLOT) == local(65)
    assert record.holder == local(65)


def test_settling_cancelling_renewing_and_granting_use_a_holder_made_before():
    for record in (r.Settle(1, 129, [1], r.SETTLE_ACK), r.Cancel(9, 1, 129), r.Renew(1, 129, []),
                   r.Grant(1, 129, 5)):
        assert idmap.map_command(record, 3, SLOT) == 0
        assert record.holder == local(129)


def test_a_release_names_the_mapped_holders():
    record = r.ReleaseHolders([65, 129])
    assert idmap.map_command(record, 3, SLOT) == 0
    assert record.holders == [local(65), local(129)]


def test_a_confirmed_publish_names_its_mapped_channel_and_an_unconfirmed_none():
    confirmed = r.Publish([1], "", "q", b"", b"m", False, 65, 7)
    plain = r.Publish([1], "", "q", b"", b"m", False)
    idmap.map_command(confirmed, 3, SLOT)
    idmap.map_command(plain, 3, SLOT)
    assert (confirmed.confirm_channel, confirmed.confirm_seq) == (local(65), 7)
    assert plain.confirm_channel == 0


def test_records_without_ids_pass_unchanged():
    for record in (r.QueueStatus(4, 1), r.PurgeQueue(4, 1), r.QueueInfo(4, []), r.Sync(4)):
        before = msgspec.structs.replace(record)
        assert idmap.map_command(record, 3, SLOT) == 0
        assert record == before


A, B = (3, 1), (7, 2)  # two senders: node 3's gateway 1, node 7's gateway 2


def test_events_go_back_renamed_to_the_sender_of_their_holder():
    deliver = r.Deliver(local(65), 1, 1, False, "", "q", b"", b"m")
    cancelled = r.ConsumerCancelled(local(130, 7), 1)
    timed_out = r.ConsumerTimedOut(local(65), 1, [1], 100)
    routed = idmap.route_events([deliver, cancelled, timed_out], {A: None, B: None})
    assert routed == {A: [r.Deliver(65, 1, 1, False, "", "q", b"", b"m"),
                          r.ConsumerTimedOut(65, 1, [1], 100)],
                      B: [r.ConsumerCancelled(130, 1)]}


def test_confirms_are_split_by_their_channels_senders():
    event = r.Confirmed([local(65), local(130, 7), local(129)], [1, 2, 3])
    routed = idmap.route_events([event, r.Rejected([local(130, 7)], [4])], {A: None, B: None})
    assert routed == {A: [r.Confirmed([65, 129], [1, 3])],
                      B: [r.Confirmed([130], [2]), r.Rejected([130], [4])]}


def test_alarms_and_deleted_queues_go_to_every_sender():
    alarm, deleted = r.Alarm("memory", True), r.QueueDeleted(4)
    assert idmap.route_events([alarm, deleted], {A: None, B: None}) == \
        {A: [alarm, deleted], B: [alarm, deleted]}


def test_what_concerns_no_sender_now_is_left_out():
    events = [r.Deliver(local(65), 1, 1, False, "", "q", b"", b"m"),
              r.Confirmed([local(65)], [1]), r.Alarm("disk", False)]
    assert idmap.route_events(events, {}) == {}
    assert idmap.route_events(events, {B: None}) == {B: [r.Alarm("disk", False)]}


@given(st.lists(st.tuples(ids, st.sampled_from([A, B])), min_size=1, max_size=20))
def test_a_commands_ids_come_back_as_they_were(made):
    """Consumers made on two nodes: the deliveries for them return to their makers
    with the ids they made."""
    senders = {A: None, B: None}
    expected: dict = {}
    events = []
    for n, (ident, (node, gateway)) in enumerate(made):
        holder = ident * 64 + gateway  # as node `node`'s gateway `gateway` makes ids
        consume = r.Consume(1, 1, holder, holder, "t", False, False, 0, 0)
        idmap.map_command(consume, node, SLOT)
        events.append(r.Deliver(consume.holder, 1, n, False, "", "", b"", b""))
        expected.setdefault((node, gateway), []).append((holder, n))
    routed = idmap.route_events(events, senders)
    assert {key: [(e.holder, e.seq) for e in got] for key, got in routed.items()} == expected
