"""The status a replica group's leader reports (Leader.status): its epoch, its
commit index and each member's index, members in sorted order of names."""

from __future__ import annotations

from warren.shards.replication import Leader


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
