"""Stores of earlier formats upgraded in place: their queues keep their definitions
and their messages stay readable, without a broker."""

from __future__ import annotations

import pytest

from warren.storage.metastore import MetaStore, QueueDef
from warren.storage.queuespec import QueueSpec
from warren.storage.shardstore import ShardStore, StoredMessage, StoredQueue, WriteBatch
from warren.storage.upgrade import FORMAT, upgrade
from warren.storage.verify import check_store

from ..support.oldformats import as_format_1, as_format_2

ARGUMENTS = {"x-queue-type": "quorum", "x-max-length": 10}
SPEC = QueueSpec("/", "orders", True, False, False, ARGUMENTS)
IN_FORCE = {**ARGUMENTS, "x-message-ttl": 60000}  # with a policy's


def write_today(data) -> None:
    store = ShardStore(str(data / "shard-0"), 1 << 24)
    batch = WriteBatch()
    batch.put_queue(7, StoredQueue(SPEC, IN_FORCE))
    batch.put_message(7, 1, StoredMessage("ex", "rk", b"\x00\x00", b"hello"))
    store.commit(batch)
    store.close()
    meta = MetaStore(str(data / "meta"))
    meta.put_queue(QueueDef(SPEC, 7, 0))
    meta.close()


@pytest.mark.parametrize("downgrade,found", [(as_format_1, 1), (as_format_2, 2)])
def test_an_outdated_store_is_upgraded_with_its_queues_and_messages(tmp_path, downgrade, found):
    write_today(tmp_path)
    downgrade(tmp_path, ["meta", "shard-0"])
    for store in ("meta", "shard-0"):
        assert check_store(str(tmp_path / store)).outdated == found
    shard = upgrade(str(tmp_path / "shard-0"))
    meta = upgrade(str(tmp_path / "meta"))
    assert (shard.found, shard.queues, meta.found, meta.queues) == (found, 1, found, 1)
    assert f"from format {found} to {FORMAT}" in shard.describe("shard-0")
    for store in ("meta", "shard-0"):
        report = check_store(str(tmp_path / store))
        assert (report.outdated, report.problems) == (0, [])
        assert upgrade(str(tmp_path / store)) is None  # current now: nothing to do
    store = ShardStore(str(tmp_path / "shard-0"), 1 << 24)
    # The shard store knew only the arguments in force: they stand for the declared ones.
    assert store.queues() == {7: StoredQueue(QueueSpec("/", "orders", True, False, False,
                                                       IN_FORCE), IN_FORCE)}
    assert store.read(7, 1) == StoredMessage("ex", "rk", b"\x00\x00", b"hello")
    store.close()
    meta_store = MetaStore(str(tmp_path / "meta"))
    assert meta_store.load().queues == [QueueDef(SPEC, 7, 0)]
    meta_store.close()


def test_a_store_written_today_needs_no_upgrade(tmp_path):
    write_today(tmp_path)
    assert upgrade(str(tmp_path / "shard-0")) is None
    assert upgrade(str(tmp_path / "meta")) is None
    assert check_store(str(tmp_path / "shard-0")).queues == {7: StoredQueue(SPEC, IN_FORCE)}
