"""The status a replica group's leader reports (Leader.status): its epoch, its
commit index and each member's index, members in sorted order of names."""

from __future__ import annotations

from warren.shards.replication import Leader, Snapshot


def test_status_follows_appends_and_acks():
    leader = Leader("g", 4, ["c", "a", "b"], ["a", "b", "c"], "b", 0)
    assert leader.status() == [4, 0, 0, 0, 0]  # nobody heard from yet
    leader.hello("a", 4, 0, 0, 0)
    leader.hello("c", 4, 0, 0, 0)
    leader.append(["r1"], 10)
    leader.append(["r2"], 10)
    leader.durable_here(2)
    leader.acked("a", 4, 2)
    assert leader.status() == [4, 0, 2, 2, 0]  # c holds nothing yet: no commit
    leader.acked("c", 4, 1)
    assert leader.status() == [4, 1, 2, 2, 1]
    leader.acked("c", 4, 2)
    assert leader.status() == [4, 2, 2, 2, 2]


def test_regroup_a_new_member_counts_once_in_sync_a_removed_one_no_more():
    leader = Leader("g", 1, ["a", "b"], ["a", "b"], "a", 0)
    leader.hello("b", 1, 0, 0, 0)
    leader.append(["r1"], 10)
    leader.durable_here(1)
    leader.acked("b", 1, 1)
    assert leader.status() == [1, 1, 1, 1]
    leader.regroup(["a", "b", "c"], ["a", "b"])  # c joins, out of the in-sync set
    assert leader.status() == [1, 1, 1, 1, 0]
    leader.append(["r2"], 10)
    leader.durable_here(2)
    leader.acked("b", 1, 2)
    assert leader.take_committed() == 2  # c, not in sync, holds nothing back
    assert leader.isr_proposal(0.0) is None  # c has not said hello: still out
    leader.hello("c", 1, 0, 0, 0)
    if any(type(send) is Snapshot for send in leader.take_sends()):  # behind what is kept
        leader.snapshot_started("c", 2)
    leader.acked("c", 1, 2)
    assert leader.isr_proposal(0.0) == {"a", "b", "c"}
    leader.isr_written(["a", "b", "c"])
    leader.regroup(["a", "c"], ["a", "c"])  # b removed from the in-sync set first
    assert sorted(leader.peers) == ["c"] and leader.isr == {"a", "c"}
    leader.append(["r3"], 10)
    leader.durable_here(3)
    assert leader.take_committed() is None  # c must hold it: b's ack would not do
    leader.acked("c", 1, 3)
    assert leader.take_committed() == 3
