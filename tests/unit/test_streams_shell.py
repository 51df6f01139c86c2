"""A shard's streams (shards/streams.py) over real segment logs in a temp dir:
appends become readable only once the group commit's sync ran, consumers are fed
from the files with the x-stream-offset header, retention, deletion, and the
statistics record."""

from __future__ import annotations

import json
import os

from hypothesis import given
from hypothesis import strategies as st

from warren.gateway.amqp.properties import BasicProperties, decode_properties, encode_properties
from warren.shards import records as r
from warren.shards.persister import Persister
from warren.shards.stats import StatsLog
from warren.shards.streams import Streams, _with_offset, stream_path
from warren.shards.timers import TimerHeap
from warren.storage.queuespec import QueueSpec
from warren.storage.shardstore import ShardStore

QID = 3


class Outbox:
    def __init__(self):
        self.events = []

    def add(self, event) -> None:
        self.events.append(event)


def make(tmp_path, **arguments) -> tuple[Streams, Outbox]:
    streams, outbox = Streams(), Outbox()
    streams.bind(outbox, TimerHeap())
    args = {"x-queue-type": "stream", **arguments}
    streams.open(r.CreateQueue(0, QID, QueueSpec("/", "s", True, False, False, args), args),
                 stream_path(str(tmp_path), QID))
    return streams, outbox


def publish(streams: Streams, body: bytes, headers: dict | None = None) -> None:
    properties = encode_properties(BasicProperties(headers=headers))
    streams.publish(QID, r.Publish([QID], "ex", "rk", properties, body, True))


def commit(streams: Streams, ok: bool = True) -> None:
    points, flushed = streams.sync_points()
    assert flushed
    for _qid, point, _records in points:
        point.run()
    streams.synced(points, ok)


def consume(streams: Streams, holder: int, start: str = "first", at: int = 0,
            prefetch: int = 10) -> None:
    streams.apply(QID, r.Consume(holder, QID, holder, 1, "t", False, False, prefetch, 2000, 0, 0,
                                 start, at), 0.0)


def delivered(outbox: Outbox) -> list[tuple[int, int, bytes, object]]:
    out = []
    for event in outbox.events:
        if type(event) is r.Deliver:
            out.append((event.holder, event.seq, event.body,
                        decode_properties(event.properties).headers))
    outbox.events = [e for e in outbox.events if type(e) is not r.Deliver]
    return out


def test_only_what_is_synced_is_read_each_record_with_its_offset(tmp_path):
    streams, outbox = make(tmp_path)
    consume(streams, 1)
    publish(streams, b"a", {"keep": "me"})
    publish(streams, b"b")
    assert delivered(outbox) == [] and streams.dirty == {QID}
    commit(streams)
    assert delivered(outbox) == [(1, 0, b"a", {"keep": "me", "x-stream-offset": 0}),
                                 (1, 1, b"b", {"x-stream-offset": 1})]
    consume(streams, 2, start="offset", at=1)
    assert delivered(outbox) == [(2, 1, b"b", {"x-stream-offset": 1})]


def test_the_offset_header_is_a_long_as_rabbitmqs(tmp_path):
    streams, outbox = make(tmp_path)
    consume(streams, 1)
    publish(streams, b"a")
    commit(streams)
    raw = outbox.events[-1].properties
    assert b"\x0fx-stream-offsetl" + (0).to_bytes(8, "big") in raw


def test_a_failed_commit_keeps_the_records_for_the_next(tmp_path):
    streams, outbox = make(tmp_path)
    consume(streams, 1)
    publish(streams, b"a")
    commit(streams, ok=False)
    assert delivered(outbox) == [] and streams.dirty == {QID}
    commit(streams)
    assert [seq for _, seq, _, _ in delivered(outbox)] == [0]


def test_retention_by_size_and_deletion(tmp_path):
    streams, outbox = make(tmp_path, **{"x-stream-max-segment-size-bytes": 300,
                                        "x-max-length-bytes": 600})
    for _ in range(20):
        publish(streams, b"." * 100)
        commit(streams)
    figures = dict(zip(r.QUEUE_INFO_FIELDS, streams.figures(QID)))
    assert 0 < figures["ready"] < 20 and figures["disk_bytes"] <= 600 + 300
    consume(streams, 1)
    assert [seq for _, seq, _, _ in delivered(outbox)] == list(range(20 - figures["ready"], 20))
    streams.apply(QID, r.DeleteQueue(9, QID, False, False), 0.0)
    assert r.ConsumerCancelled(1, QID) in outbox.events
    assert QID not in streams.streams and not os.path.exists(stream_path(str(tmp_path), QID))


def test_the_statistics_log_a_streams_appends_and_reads(tmp_path):
    streams, outbox = make(tmp_path)
    consume(streams, 1)
    publish(streams, b"abc")
    commit(streams)
    stats = StatsLog(str(tmp_path / "logs"), 0)
    stats.streams = streams

    class Commits:
        fsyncs = messages = 0

        def take_interval(self):
            return {}, []

    stats.tick(1.0, [], Commits(), force=True)
    stats.close()
    with open(tmp_path / "logs" / "shard-0.jsonl") as lines:
        record = next(json.loads(line) for line in lines if '"queue_stats"' in line)
    assert (record["queue_type"], record["published"], record["published_bytes"],
            record["delivered"], record["ready"], record["segments"]) == ("stream", 1, 3, 1, 1, 1)



def test_a_consumer_reading_into_damage_is_cancelled_and_the_shard_goes_on(tmp_path):
    streams, outbox = make(tmp_path)
    for body in (b"first", b"second"):
        publish(streams, body)
        commit(streams)
    segment = os.path.join(stream_path(str(tmp_path), QID), "0" * 20 + ".seg")
    with open(segment, "r+b") as file:  # a bit of the first record's payload flips
        data = file.read()
        at = data.index(b"first")
        file.seek(at)
        file.write(b"F")
    consume(streams, 1)
    assert r.ConsumerCancelled(1, QID) in outbox.events and 1 not in streams.streams[QID].readers
    assert not streams.streams[QID].core.consumers
    publish(streams, b"third")
    commit(streams)
    assert streams.figures(QID)[1] == 3


def test_a_stream_deleted_while_its_sync_waits_fails_no_commit(tmp_path):
    persister = Persister({0: ShardStore(str(tmp_path / "shard-0"))}, 0)
    persister.streams.bind(Outbox(), TimerHeap())
    args = {"x-queue-type": "stream"}
    persister.create_stream(r.CreateQueue(0, QID, QueueSpec("/", "s", True, False, False, args),
                                          args))
    persister.commit(lambda *a: None)
    persister.append(QID, r.Publish([QID], "", "s", encode_properties(BasicProperties()), b"x",
                                    True))
    pending = persister.begin_commit()  # a segment was created: its directory is synced too
    persister.streams.apply(QID, r.DeleteQueue(1, QID, False, False), 0.0)
    Persister.run_commit(pending)
    assert pending.ok
    persister.close()


def test_a_feed_goes_on_past_a_read_cut_short_by_its_bytes(tmp_path):
    streams, outbox = make(tmp_path)
    consume(streams, 1)
    for _ in range(3):
        publish(streams, b"." * (600 << 10))  # two of them exceed a read's bytes
    commit(streams)
    assert [seq for _, seq, _, _ in delivered(outbox)] == [0, 1, 2]


short = st.one_of(st.none(), st.text(max_size=20))
header_values = st.one_of(st.integers(-2**31, 2**31 - 1), st.text(max_size=10), st.booleans())


@given(content_type=short, content_encoding=short,
       headers=st.one_of(st.none(), st.dictionaries(
           st.text(min_size=1, max_size=12), header_values, max_size=4)),
       delivery_mode=st.one_of(st.none(), st.sampled_from([1, 2])), message_id=short,
       offset=st.integers(0, 2**62))
def test_the_offset_header_spliced_into_raw_properties_is_what_decoding_would_give(
        content_type, content_encoding, headers, delivery_mode, message_id, offset):
    props = BasicProperties(content_type=content_type, content_encoding=content_encoding,
                            headers=headers, delivery_mode=delivery_mode,
                            message_id=message_id)
    spliced = decode_properties(_with_offset(encode_properties(props), offset))
    assert spliced.headers == {**(headers or {}), "x-stream-offset": offset}
    assert (spliced.content_type, spliced.content_encoding, spliced.delivery_mode,
            spliced.message_id) == (content_type, content_encoding, delivery_mode, message_id)


def test_a_publisher_s_own_offset_header_is_replaced_and_malformed_properties_kept():
    raw = encode_properties(BasicProperties(headers={"x-stream-offset": "mine", "a": 1}))
    assert decode_properties(_with_offset(raw, 7)).headers == {"x-stream-offset": 7, "a": 1}
    torn = encode_properties(BasicProperties(headers={"a": 1}))[:-2]
    assert _with_offset(torn, 7) == torn
