"""The etcd client (gateway/cluster/etcd.py) against a real etcd: keys,
transactions, leases, watches across a restart and a compaction, and its
deadlines when etcd is gone or hangs."""

from __future__ import annotations

import asyncio
import base64
import socket
import time

import pytest

from warren.gateway.cluster.etcd import (
    Compare,
    Etcd,
    EtcdError,
    EtcdUnavailable,
    KeyValue,
    Lease,
    Op,
    WatchEvent,
)

from ..support.aio import run, until
from ..support.broker import free_port
from ..support.etcd import etcd_or_skip, etcd_server_fixture  # noqa: F401 (etcd_server)

pytestmark = pytest.mark.run_once  # no broker: nothing depends on the gateway count


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def put_behind(server, key: bytes, value: bytes) -> int:
    """A put through the server's gateway directly, blocking the test's loop."""
    return int(server.call("/v3/kv/put", {"key": b64(key), "value": b64(value)})
               ["header"]["revision"])


def delete_behind(server, key: bytes) -> int:
    return int(server.call("/v3/kv/deleterange", {"key": b64(key)})["header"]["revision"])


def seen(events: list[WatchEvent]) -> list[tuple[str, bytes, bytes, int]]:
    return [(e.type, e.kv.key, e.kv.value, e.kv.mod_revision) for e in events]


def test_put_get_range_delete(etcd_server):
    async def scenario():
        etcd = Etcd([etcd_server.endpoint])
        try:
            first = await etcd.put(b"/t/a", b"1")
            assert await etcd.put(b"/t/b", b"\x00\xff") == first + 1
            await etcd.put(b"/u/c", b"outside")
            assert await etcd.get(b"/t/a") == KeyValue(b"/t/a", b"1", first, first, 1)
            assert await etcd.get(b"/t/none") is None
            kvs, revision = await etcd.range(b"/t/")
            assert [(kv.key, kv.value) for kv in kvs] == [(b"/t/a", b"1"), (b"/t/b", b"\x00\xff")]
            assert revision == first + 2
            again = await etcd.put(b"/t/a", b"2")
            assert await etcd.get(b"/t/a") == KeyValue(b"/t/a", b"2", first, again, 2)
            assert await etcd.delete(b"/t/a") == again + 1
            assert await etcd.get(b"/t/a") is None
            assert [kv.key for kv in (await etcd.range(b"/t/"))[0]] == [b"/t/b"]
        finally:
            await etcd.close()

    run(scenario())


def test_transactions(etcd_server):
    async def scenario():
        etcd = Etcd([etcd_server.endpoint])
        try:
            absent = [Compare.create_revision(b"q", "=", 0)]
            made = await etcd.txn(absent, [Op.put(b"q", b"one"), Op.get(b"q")], [Op.get(b"q")])
            assert made.succeeded
            assert made.responses == [[], [KeyValue(b"q", b"one", made.revision, made.revision,
                                                    1)]]
            refused = await etcd.txn(absent, [Op.put(b"q", b"two")], [Op.get(b"q")])
            assert not refused.succeeded and refused.revision == made.revision
            assert [kv.value for kv in refused.responses[0]] == [b"one"]
            stale = await etcd.txn([Compare.mod_revision(b"q", "=", made.revision - 1)],
                                   [Op.delete(b"q")])
            assert not stale.succeeded and stale.responses == []
            same = await etcd.txn([Compare.value(b"q", "=", b"one"),
                                   Compare.mod_revision(b"q", "=", made.revision)],
                                  [Op.delete(b"q")])
            assert same.succeeded and await etcd.get(b"q") is None

            # two nodes declaring one queue at once: exactly one wins, every time
            for n in range(20):
                key = b"race/%d" % n
                wins = await asyncio.gather(*(
                    etcd.txn([Compare.create_revision(key, "=", 0)], [Op.put(key, side)])
                    for side in (b"left", b"right")))
                assert sorted(w.succeeded for w in wins) == [False, True]
                winner = next(side for side, w in zip((b"left", b"right"), wins) if w.succeeded)
                assert (await etcd.get(key)).value == winner
        finally:
            await etcd.close()

    run(scenario())


def test_a_revoked_lease_takes_its_keys_and_is_reported_lost(etcd_server):
    async def scenario():
        etcd = Etcd([etcd_server.endpoint])
        lost: list[str] = []
        try:
            lease = await Lease.grant(etcd, 2, lambda: lost.append("lost"))
            await etcd.put(b"/n/me", b"up", lease=lease.id)
            assert (await etcd.get(b"/n/me")).lease == lease.id
            await etcd.revoke(lease.id)  # as if etcd had expired it
            assert await etcd.get(b"/n/me") is None
            await until(lambda: lost, message="on_lost after the lease went")
            assert await etcd.keepalive_once(lease.id) == 0
            await lease.stop()
            assert lost == ["lost"]
        finally:
            await etcd.close()

    run(scenario())


def test_a_lease_lives_while_kept_and_is_lost_when_etcd_hangs_past_its_ttl(etcd_server):
    async def scenario():
        etcd = Etcd([etcd_server.endpoint], timeout=0.5)
        lost: list[float] = []
        try:
            lease = await Lease.grant(etcd, 2, lambda: lost.append(time.monotonic()))
            await etcd.put(b"/n/me", b"up", lease=lease.id)
            # a duration, not a condition: the key must outlive its TTL while kept
            await asyncio.sleep(3)
            assert (await etcd.get(b"/n/me")).value == b"up" and not lost
            paused = time.monotonic()
            etcd_server.pause()
            try:
                await until(lambda: lost, timeout=5, message="on_lost while etcd hangs")
            finally:
                etcd_server.resume()
            assert lost[0] - paused <= 2.5  # the TTL, counted from the last refresh
            # etcd itself expires the lease once it runs again
            deadline = time.monotonic() + 10
            while await etcd.get(b"/n/me") is not None:
                assert time.monotonic() < deadline, "the key outlived its lease"
                await asyncio.sleep(0.05)
            await lease.stop()
            assert len(lost) == 1
        finally:
            await etcd.close()

    run(scenario())


def test_a_watch_delivers_in_order_and_resumes_after_a_restart_without_loss_or_repeat(
        etcd_server):
    async def scenario():
        etcd = Etcd([etcd_server.endpoint])
        events: list[WatchEvent] = []
        headers: list[int] = []
        errors: list[Exception] = []
        compacted: list[int] = []

        def on_events(batch, revision):
            events.extend(batch)
            headers.append(revision)

        async def on_compacted(revision):
            compacted.append(revision)
            return revision

        try:
            start = await etcd.put(b"/w/seed", b"before the watch")
            watch = etcd.watch(b"/w/", start + 1, on_events, errors.append, on_compacted)
            a = await etcd.put(b"/w/a", b"1")
            await etcd.put(b"/x/other", b"not watched")
            b = await etcd.put(b"/w/b", b"2")
            gone = await etcd.delete(b"/w/a")
            both = await etcd.txn([], [Op.put(b"/w/c", b"3"), Op.put(b"/w/d", b"4")])
            expected = [("PUT", b"/w/a", b"1", a), ("PUT", b"/w/b", b"2", b),
                        ("DELETE", b"/w/a", b"", gone), ("PUT", b"/w/c", b"3", both.revision),
                        ("PUT", b"/w/d", b"4", both.revision)]
            await until(lambda: len(events) >= 5, message="the first events")
            assert seen(events) == expected
            assert headers[-1] >= both.revision

            etcd_server.stop()
            await until(lambda: errors, message="the watch noticing etcd is gone")
            # Blocking calls: the loop is held, so the watch reconnects only after
            # these writes, and must fetch them from where it stopped.
            etcd_server.start()
            e = put_behind(etcd_server, b"/w/e", b"5")
            b_gone = delete_behind(etcd_server, b"/w/b")
            expected += [("PUT", b"/w/e", b"5", e), ("DELETE", b"/w/b", b"", b_gone)]
            await until(lambda: len(events) >= 7, message="the events missed while away")
            f = await etcd.put(b"/w/f", b"6")
            expected.append(("PUT", b"/w/f", b"6", f))
            await until(lambda: len(events) >= 8, message="an event after the reconnection")
            assert seen(events) == expected
            assert all(isinstance(error, EtcdUnavailable) for error in errors)
            assert not compacted
            await watch.cancel()
            await etcd.put(b"/w/g", b"after the cancel")
            assert len(events) == 8
        finally:
            await etcd.close()

    run(scenario())


def test_progress_notifications_move_an_idle_watch_on(tmp_path):
    server = etcd_or_skip(str(tmp_path / "etcd"),
                          ["--experimental-watch-progress-notify-interval", "100ms"])

    async def scenario():
        etcd = Etcd([server.endpoint])
        events: list[WatchEvent] = []
        errors: list[Exception] = []

        async def on_compacted(revision):
            raise AssertionError("nothing was compacted")

        try:
            start = await etcd.put(b"/y/unwatched", b"0")
            watch = etcd.watch(b"/w/", start, lambda batch, _: events.extend(batch),
                               errors.append, on_compacted)
            last = 0
            for n in range(5):
                last = await etcd.put(b"/y/unwatched", b"%d" % n)
            await until(lambda: watch.next_revision > last, message="a progress notification")
            written = await etcd.put(b"/w/k", b"v")
            await until(lambda: events, message="an event after the progress")
            assert seen(events) == [("PUT", b"/w/k", b"v", written)] and not errors
        finally:
            await etcd.close()

    with server:
        run(scenario())


def test_a_watch_from_a_compacted_revision_reloads_and_goes_on(etcd_server):
    async def scenario():
        etcd = Etcd([etcd_server.endpoint])
        events: list[WatchEvent] = []
        errors: list[Exception] = []
        reloads: list[int] = []
        state: dict[bytes, bytes] = {}

        async def reload(revision):
            kvs, at = await etcd.range(b"/c/")
            state.clear()
            state.update((kv.key, kv.value) for kv in kvs)
            reloads.append(revision)
            return at

        try:
            first = await etcd.put(b"/c/a", b"1")
            await etcd.put(b"/c/a", b"2")
            await etcd.put(b"/c/b", b"3")
            now = await etcd.delete(b"/c/b")
            etcd_server.call("/v3/kv/compaction", {"revision": now})
            watch = etcd.watch(b"/c/", first, lambda batch, _: events.extend(batch),
                               errors.append, reload)
            await until(lambda: reloads, message="the compaction hook")
            assert reloads == [now] and state == {b"/c/a": b"2"} and not events
            later = await etcd.put(b"/c/z", b"9")
            await until(lambda: events, message="an event after the reload")
            assert seen(events) == [("PUT", b"/c/z", b"9", later)] and not errors
            assert watch.next_revision == later + 1
        finally:
            await etcd.close()

    run(scenario())


def test_unavailable_within_the_deadline(etcd_server):
    async def scenario():
        nobody = f"http://127.0.0.1:{free_port()}"
        etcd = Etcd([nobody], timeout=1.0)
        hung = Etcd([etcd_server.endpoint], timeout=1.0)
        try:
            for call in (lambda: etcd.put(b"k", b"v"), lambda: etcd.get(b"k")):
                began = time.monotonic()
                with pytest.raises(EtcdUnavailable):
                    await call()
                assert time.monotonic() - began < 1.5
            await hung.put(b"k", b"v")  # a kept-alive connection, then etcd hangs
            etcd_server.pause()
            try:
                for call in (lambda: hung.put(b"k", b"w"), lambda: hung.get(b"k"),
                             lambda: hung.range(b""), lambda: hung.txn([], [Op.delete(b"k")]),
                             lambda: hung.grant(5)):
                    began = time.monotonic()
                    with pytest.raises(EtcdUnavailable):
                        await call()
                    assert time.monotonic() - began < 1.5
            finally:
                etcd_server.resume()
            etcd_server.stop()
            with pytest.raises(EtcdUnavailable):
                await hung.get(b"k")
        finally:
            await etcd.close()
            await hung.close()

    run(scenario())


def test_the_next_endpoint_serves_when_one_is_down(etcd_server):
    async def scenario():
        etcd = Etcd([f"http://127.0.0.1:{free_port()}", etcd_server.endpoint], timeout=2.0)
        try:
            revision = await etcd.put(b"k", b"v")
            assert (await etcd.get(b"k")).mod_revision == revision
            with pytest.raises(EtcdError) as raised:  # etcd's own error is not unavailability
                await etcd.revoke(12345)
            assert "lease not found" in raised.value.message
        finally:
            await etcd.close()

    run(scenario())


def test_a_hung_endpoint_costs_a_read_its_share_and_a_write_its_answer(etcd_server):
    """A member that takes connections but never answers: a read moves on to
    the next endpoint within the deadline; a write, which may have been applied,
    is not sent again but fails, and the next call starts at the next endpoint."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel completes connections nobody reads
        hung = f"http://127.0.0.1:{silent.getsockname()[1]}"

        async def scenario():
            etcd = Etcd([hung, etcd_server.endpoint], timeout=2.0)
            try:
                began = time.monotonic()
                assert await etcd.get(b"k") is None
                assert 0.9 <= time.monotonic() - began < 2.5  # half the deadline on the hung one
                written = Etcd([hung, etcd_server.endpoint], timeout=1.0)
                try:
                    with pytest.raises(EtcdUnavailable):
                        await written.put(b"k", b"v")
                    assert await etcd.get(b"k") is None  # not sent to the live endpoint
                    revision = await written.put(b"k", b"v")  # starts at the next one
                    assert (await etcd.get(b"k")).mod_revision == revision
                finally:
                    await written.close()
            finally:
                await etcd.close()

        run(scenario())
