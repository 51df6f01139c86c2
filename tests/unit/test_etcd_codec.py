"""The etcd client's pure parts: the JSON gateway's requests as they go out,
and its answers (as etcd 3.4 writes them: int64 as strings, base64 bytes,
zero values left out) as they are read."""

from __future__ import annotations

import base64
import json

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from warren.gateway.cluster.etcd import (
    UNAVAILABLE,
    Compare,
    EtcdError,
    KeyValue,
    LineBuffer,
    Op,
    WatchEvent,
    WatchUpdate,
    error_of,
    parse_grant,
    parse_keepalive,
    parse_range,
    parse_revision,
    parse_txn,
    parse_watch_line,
    prefix_end,
    put_request,
    range_request,
    resume_from,
    txn_request,
    watch_request,
)

HEADER = {"cluster_id": "15118495548433857066", "member_id": "13668033151171901709",
          "revision": "7", "raft_term": "2"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def wire(request) -> dict:
    """A request as etcd reads it."""
    return json.loads(msgspec.json.encode(request))


def answer(obj) -> bytes:
    return json.dumps(obj).encode()


@given(st.binary(max_size=6), st.binary(max_size=8))
def test_prefix_end_bounds_exactly_the_keys_under_the_prefix(prefix, key):
    end = prefix_end(prefix)
    if end == b"\0":  # etcd's "every key from `prefix` on"
        assert prefix.strip(b"\xff") == b""
        inside = key >= prefix
    else:
        inside = prefix <= key < end
    assert inside == key.startswith(prefix)


def test_prefix_end_examples():
    assert prefix_end(b"/warren/") == b"/warren0"
    assert prefix_end(b"a\xff\xff") == b"b"
    assert prefix_end(b"\xff") == b"\0"


def test_requests_carry_keys_and_values_in_base64():
    assert wire(range_request(b"/w/q")) == {"key": b64(b"/w/q")}
    assert wire(range_request(b"/w/", prefix=True)) == {"key": b64(b"/w/"),
                                                        "range_end": b64(b"/w0")}
    assert wire(put_request(b"k", b"\x00\xff")) == {"key": b64(b"k"), "value": b64(b"\x00\xff")}
    lease = 4111120312717181973  # past a double's precision: it must go as an exact integer
    assert b'"lease":4111120312717181973' in msgspec.json.encode(put_request(b"k", b"v", lease))


def test_txn_request():
    request = wire(txn_request(
        [Compare.create_revision(b"k", "=", 0), Compare.mod_revision(b"m", "<", 9),
         Compare.value(b"v", "!=", b"x")],
        [Op.put(b"k", b"1", lease=5), Op.get(b"k")], [Op.delete(b"k")]))
    assert request == {
        "compare": [
            {"key": b64(b"k"), "target": "CREATE", "result": "EQUAL", "create_revision": 0},
            {"key": b64(b"m"), "target": "MOD", "result": "LESS", "mod_revision": 9},
            {"key": b64(b"v"), "target": "VALUE", "result": "NOT_EQUAL", "value": b64(b"x")}],
        "success": [{"request_put": {"key": b64(b"k"), "value": b64(b"1"), "lease": 5}},
                    {"request_range": {"key": b64(b"k")}}],
        "failure": [{"request_delete_range": {"key": b64(b"k")}}]}


def test_watch_request_asks_for_progress_notifications():
    assert wire(watch_request(b"/w/", 12)) == {"create_request": {
        "key": b64(b"/w/"), "range_end": b64(b"/w0"), "start_revision": 12,
        "progress_notify": True}}


def test_range_answer():
    kvs, revision = parse_range(answer({"header": HEADER, "count": "1", "kvs": [
        {"key": b64(b"a"), "create_revision": "2", "mod_revision": "3", "version": "2",
         "value": b64(b"b"), "lease": "4111120312717181973"}]}))
    assert revision == 7
    assert kvs == [KeyValue(b"a", b"b", 2, 3, 2, 4111120312717181973)]


def test_empty_values_and_empty_ranges_are_left_out():
    assert parse_range(answer({"header": HEADER})) == ([], 7)
    kvs, _ = parse_range(answer({"header": HEADER, "kvs": [
        {"key": b64(b"a"), "create_revision": "2", "mod_revision": "2", "version": "1"}]}))
    assert kvs == [KeyValue(b"a", b"", 2, 2, 1, 0)]


def test_put_and_delete_answer_their_revision():
    assert parse_revision(answer({"header": HEADER})) == 7
    assert parse_revision(answer({"header": HEADER, "deleted": "1"})) == 7


def test_txn_answers():
    done = parse_txn(answer({"header": HEADER, "succeeded": True, "responses": [
        {"response_put": {"header": {"revision": "7"}}},
        {"response_range": {"header": {"revision": "7"}, "count": "1", "kvs": [
            {"key": b64(b"k"), "create_revision": "7", "mod_revision": "7", "version": "1",
             "value": b64(b"1")}]}},
        {"response_range": {"header": {"revision": "7"}}},
        {"response_delete_range": {"header": {"revision": "7"}}}]}))
    assert done.succeeded and done.revision == 7
    assert done.responses == [[], [KeyValue(b"k", b"1", 7, 7, 1)], [], []]
    failed = parse_txn(answer({"header": HEADER}))  # etcd leaves out succeeded: false
    assert not failed.succeeded and failed.revision == 7 and failed.responses == []


def test_leases():
    assert parse_grant(answer({"header": HEADER, "ID": "4111120312717181962", "TTL": "5"})) \
        == 4111120312717181962
    with pytest.raises(EtcdError, match="too many"):
        parse_grant(answer({"header": HEADER, "error": "too many"}))
    assert parse_keepalive(answer({"result": {"header": HEADER, "ID": "9", "TTL": "4"}})) == 4
    assert parse_keepalive(answer({"result": {"header": HEADER, "ID": "9"}})) == 0  # gone
    with pytest.raises(EtcdError) as raised:
        parse_keepalive(answer({"error": {"grpc_code": 14, "http_code": 503,
                                          "message": "etcdserver: no leader"}}))
    assert raised.value.code == UNAVAILABLE


def test_errors():
    assert error_of(200, b"{}") is None
    error = error_of(400, answer({"error": "etcdserver: mvcc: required revision has been "
                                  "compacted", "message": "etcdserver: mvcc: required revision "
                                  "has been compacted", "code": 11}))
    assert error is not None and error.code == 11 and "compacted" in error.message
    other = error_of(502, b"<html>bad gateway</html>")
    assert other is not None and "HTTP 502" in other.message
    with pytest.raises(EtcdError, match="unexpected answer"):
        parse_range(b"{not json")


def test_watch_lines():
    created = parse_watch_line(answer({"result": {"header": HEADER, "created": True}}))
    assert created == WatchUpdate(7, created=True)
    events = parse_watch_line(answer({"result": {"header": HEADER, "events": [
        {"kv": {"key": b64(b"a"), "create_revision": "2", "mod_revision": "2", "version": "1",
                "value": b64(b"b")}},
        {"type": "DELETE", "kv": {"key": b64(b"a"), "mod_revision": "4"}}]}}))
    assert events.events == [WatchEvent(KeyValue(b"a", b"b", 2, 2, 1)),
                             WatchEvent(KeyValue(b"a", mod_revision=4), "DELETE")]
    progress = parse_watch_line(answer({"result": {"header": HEADER}}))
    assert progress == WatchUpdate(7)
    compacted = parse_watch_line(answer({"result": {"header": HEADER, "canceled": True,
                                                    "compact_revision": "3"}}))
    assert compacted.compact_revision == 3
    with pytest.raises(EtcdError, match="cancelled the watch: permission denied"):
        parse_watch_line(answer({"result": {"header": HEADER, "canceled": True,
                                            "cancel_reason": "permission denied"}}))
    with pytest.raises(EtcdError) as raised:
        parse_watch_line(answer({"error": {"grpc_code": 14, "message": "no leader"}}))
    assert raised.value.code == UNAVAILABLE


def event(revision: int) -> WatchEvent:
    return WatchEvent(KeyValue(b"k", mod_revision=revision))


def test_a_watch_resumes_past_what_it_has_seen():
    assert resume_from(5, WatchUpdate(20, created=True)) == 5  # history from 5 still to come
    assert resume_from(5, WatchUpdate(20, events=[event(5), event(9)])) == 10
    assert resume_from(10, WatchUpdate(30)) == 31  # a progress notification
    assert resume_from(40, WatchUpdate(30)) == 40


@given(st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=8),
       st.lists(st.integers(1, 40), max_size=10))
def test_lines_come_out_whole_however_the_stream_is_cut(lines, cuts):
    stream = b"".join(line + b"\n" for line in lines)
    buffer, out, at = LineBuffer(), [], 0
    for cut in cuts + [len(stream)]:
        out += buffer.feed(stream[at:at + cut])
        at += cut
    assert out == [line for line in lines if line.strip()]
