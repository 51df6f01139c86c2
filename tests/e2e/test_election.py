"""Replica groups' elections (gateway/cluster/election.py) against a real etcd:
three nodes' `Elections`, each on its own client and lease, in one event loop.
One leader; another in-sync member, with a larger epoch, once the leader's
lease is gone, and the old one told it is deposed; a node out of the in-sync
set never leads; a deposed leader's in-sync write is refused; racing
campaigns never both win; an etcd restart leaves one leader, and a compaction
while the watches were down reloads the groups."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator, Collection

import pytest

from warren.gateway.cluster import groups as g
from warren.gateway.cluster.election import Elections
from warren.gateway.cluster.etcd import Etcd, EtcdError, EtcdUnavailable, Lease
from warren.gateway.cluster.layout import InSync, Layout, encode_group

from ..support.aio import run, until
from ..support.etcd import etcd_server_fixture  # noqa: F401 (etcd_server)

pytestmark = pytest.mark.run_once  # no broker: nothing depends on the gateway count

LAYOUT = Layout("/e")
TTL = 2  # etcd's minimum
NAMES = ("a", "b", "c")
VHOST = "/"


class Node:
    """One node's elections and every role it was told, per group."""

    def __init__(self, name: str, endpoint: str, running: Collection[str] = NAMES):
        self.name = name
        self.regrant = False  # on losing its lease, take another (as a node that lives on)
        self.etcd = Etcd([endpoint])
        self.running = set(running)
        self.told: dict[str, list[g.Role]] = {}
        self.leaders: dict[str, list[str]] = {}  # every leader heard of, member or not
        self.lease: Lease | None = None
        self._regranting: asyncio.Task | None = None
        self.elections: Elections

    async def start(self, tell_lease_lost: bool = True) -> Node:
        self.lease = await Lease.grant(self.etcd, TTL, self._lost if tell_lease_lost
                                       else lambda: None)
        self.elections = Elections(self.etcd, LAYOUT, self.name, self.lease.id,
                                   lambda: self.running, self._told, self._leader)
        await self.elections.start()
        return self

    def _lost(self) -> None:
        self.elections.lease_lost()
        if self.regrant:
            self._regranting = asyncio.get_running_loop().create_task(self._grant_again())

    async def _grant_again(self) -> None:
        while True:
            try:
                self.lease = await Lease.grant(self.etcd, TTL, self._lost)
            except (EtcdUnavailable, EtcdError):
                await asyncio.sleep(0.2)
                continue
            self.elections.lease_granted(self.lease.id)
            return

    def _told(self, vhost: str, name: str, role: g.Role) -> None:
        assert vhost == VHOST
        self.told.setdefault(name, []).append(role)

    def _leader(self, vhost: str, name: str) -> None:
        self.leaders.setdefault(name, []).append(self.elections.views[(vhost, name)].leader)

    def role(self, group: str) -> g.Role:
        roles = [r for r in self.told.get(group, []) if not isinstance(r, g.Deposed)]
        return roles[-1] if roles else g.NoLeader()

    def led(self, group: str) -> list[int]:
        return [r.epoch for r in self.told.get(group, []) if isinstance(r, g.Leading)]

    async def stop(self) -> None:
        await self.elections.stop()
        if self.lease is not None:
            await self.lease.stop()
        await self.etcd.close()


async def nodes(endpoint: str, tell_lease_lost: bool = True,
                regrant: bool = False) -> list[Node]:
    made = []
    for name in NAMES:
        node = Node(name, endpoint)
        node.regrant = regrant
        made.append(await node.start(tell_lease_lost))
    return made


@contextlib.asynccontextmanager
async def started(endpoint: str, tell_lease_lost: bool = True,
                  regrant: bool = False) -> AsyncIterator[list[Node]]:
    """The three nodes, started, and stopped however the scenario ends."""
    all_nodes = await nodes(endpoint, tell_lease_lost, regrant)
    try:
        yield all_nodes
    finally:
        await stop(all_nodes)


async def stop(all_nodes: list[Node]) -> None:
    for node in all_nodes:
        await node.stop()


async def group(all_nodes: list[Node], name: str, members: Collection[str] = NAMES) -> None:
    assert await all_nodes[0].elections.create_group(VHOST, name, members)
    for node in all_nodes:
        if node.name in members:
            node.elections.join(VHOST, name, members)


def one_leader(all_nodes: list[Node], name: str) -> Node | None:
    """The leader every member agrees on, else None."""
    leading = [n for n in all_nodes if isinstance(n.role(name), g.Leading)]
    if len(leading) != 1:
        return None
    epoch = leading[0].role(name).epoch  # type: ignore[union-attr]
    others = [n for n in all_nodes if n is not leading[0] and n.told.get(name) is not None]
    if all(n.role(name) == g.Following(leading[0].name, epoch) for n in others):
        return leading[0]
    return None


def test_one_leader_and_another_in_sync_member_once_its_lease_is_gone(etcd_server):
    async def scenario():
        async with started(etcd_server.endpoint) as all_nodes:
            await group(all_nodes, "q")
            await until(lambda: one_leader(all_nodes, "q"), message="one leader")
            old = one_leader(all_nodes, "q")
            assert old is not None and old.name == "a"  # the preferred member
            epoch = old.led("q")[-1]
            kv = await old.etcd.get(LAYOUT.group_leader(VHOST, "q"))
            assert kv is not None and kv.create_revision == epoch and kv.lease == old.lease.id
            await asyncio.sleep(0.2)  # nobody else wins meanwhile
            assert sum(len(n.led("q")) for n in all_nodes) == 1

            await all_nodes[1].etcd.revoke(old.lease.id)  # as etcd does when its node dies
            await until(lambda: (new := one_leader(all_nodes, "q")) is not None
                        and new is not old, timeout=TTL, message="a new leader within the TTL")
            new = one_leader(all_nodes, "q")
            assert new is not None and new.led("q")[-1] > epoch
            assert g.Deposed(epoch) in old.told["q"]
            assert old.told["q"].index(g.Deposed(epoch)) == old.told["q"].index(
                g.Leading(epoch)) + 1
            assert await old.elections.set_in_sync(VHOST, "q", NAMES) is False

    run(scenario())


def test_a_node_of_no_group_hears_each_of_its_leaders(etcd_server):
    async def scenario():
        async with started(etcd_server.endpoint) as all_nodes:
            a, b, c = all_nodes
            await group(all_nodes, "q", members=("a", "b"))
            await until(lambda: c.leaders.get("q", [""])[-1] == "a", message="c hears of a")
            await a.etcd.revoke(a.lease.id)
            await until(lambda: c.leaders["q"][-1] == "b", timeout=15, message="then of b")
            assert c.told.get("q") is None  # no member: told no role

    run(scenario())


def test_a_node_restarted_before_its_lease_ran_out_does_not_lead_its_old_epoch(etcd_server):
    async def scenario():
        all_nodes = await nodes(etcd_server.endpoint)
        a, b, c = all_nodes
        again = None
        try:
            await group(all_nodes, "q")
            await until(lambda: one_leader(all_nodes, "q") is a, message="a leads")
            epoch = a.led("q")[-1]
            await a.elections.stop()  # killed: its lease lives on in etcd for a while
            a.lease._task.cancel()  # no more keep-alives: as a process killed
            again = await Node("a", etcd_server.endpoint).start()  # a's next run
            again.elections.join(VHOST, "q", NAMES)
            # Its earlier run's key goes at once (its lease revoked), and a new epoch
            # is elected well within the TTL; a's new run never leads the old one.
            await until(lambda: any(e > epoch for n in (again, b, c) for e in n.led("q")),
                        timeout=TTL, message="a new epoch")
            assert epoch not in again.led("q")
        finally:
            await stop([b, c] + ([again] if again else []))
            await a.etcd.close()

    run(scenario())


def test_a_node_out_of_the_in_sync_set_never_leads(etcd_server):
    async def scenario():
        async with started(etcd_server.endpoint) as all_nodes:
            a, b, c = all_nodes
            await group(all_nodes, "q")
            await until(lambda: one_leader(all_nodes, "q") is a, message="a leads")
            assert await a.elections.set_in_sync(VHOST, "q", ("a", "c"))
            await until(lambda: b.elections.views[(VHOST, "q")].in_sync == ("a", "c"),
                        message="b sees the in-sync set")
            # b is preferred over c, but out of sync
            await a.etcd.revoke(a.lease.id)
            await until(lambda: one_leader(all_nodes, "q") is c, message="c leads")
            await asyncio.sleep(1.0)  # past b's rank delay: b still does not campaign
            assert not b.led("q") and one_leader(all_nodes, "q") is c
            kv = await b.etcd.get(LAYOUT.group_leader(VHOST, "q"))
            assert kv is not None and kv.value == b'{"node":"c"}'

    run(scenario())


def test_a_deposed_leader_that_has_not_heard_of_it_cannot_write_the_in_sync_set(etcd_server):
    async def scenario():
        # a's lease loss is not told to its elections, and its watch stops: it
        # believes it leads until etcd refuses its write
        async with started(etcd_server.endpoint, tell_lease_lost=False) as all_nodes:
            a = all_nodes[0]
            await group(all_nodes, "q")
            await until(lambda: one_leader(all_nodes, "q") is a, message="a leads")
            epoch = a.led("q")[-1]
            assert a.elections._watch is not None
            await a.elections._watch.cancel()
            await a.etcd.revoke(a.lease.id)
            await until(lambda: any(n.led("q") for n in all_nodes[1:]),
                        message="another leader")
            assert a.role("q") == g.Leading(epoch)
            assert await a.elections.set_in_sync(VHOST, "q", ("a",)) is False
            assert a.told["q"][-2] == g.Deposed(epoch)
            assert isinstance(a.role("q"), g.Following)
            kv = await a.etcd.get(LAYOUT.group_isr(VHOST, "q"))
            assert kv is not None and b'"a"' in kv.value and b'"b"' in kv.value

    run(scenario())


def test_racing_campaigns_never_both_win(etcd_server):
    async def scenario():
        # each of b and c believes the other is not running: both campaign at once
        b = await Node("b", etcd_server.endpoint, running=("b",)).start()
        c = await Node("c", etcd_server.endpoint, running=("c",)).start()
        try:
            for round_ in range(20):
                name = f"q{round_}"
                assert await b.elections.create_group(VHOST, name, ("b", "c"))
                await until(lambda: (view := c.elections.views.get((VHOST, name))) is not None
                            and view.in_sync is not None, message="c sees the group")
                b.elections.join(VHOST, name, ("b", "c"))
                c.elections.join(VHOST, name, ("b", "c"))
                await until(lambda: one_leader([b, c], name) is not None,
                            message=f"one leader in round {round_}")
                await asyncio.sleep(0.05)  # a second winner would have been told by now
                assert len(b.led(name)) + len(c.led(name)) == 1
                winner = one_leader([b, c], name)
                assert winner is not None
                kv = await b.etcd.get(LAYOUT.group_leader(VHOST, name))
                assert kv is not None and kv.create_revision == winner.led(name)[0]
        finally:
            await stop([b, c])

    run(scenario())


def test_an_etcd_restart_leaves_one_leader_and_no_error(etcd_server, caplog):
    async def scenario():
        errors: list[dict] = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, error:
                                                         errors.append(error))
        async with started(etcd_server.endpoint, regrant=True) as all_nodes:
            await group(all_nodes, "q")
            await until(lambda: one_leader(all_nodes, "q") is not None, message="one leader")
            old = one_leader(all_nodes, "q")
            assert old is not None
            etcd_server.stop()
            await until(lambda: caplog.text.count("lost the watch on the replica groups") == 3,
                        message="the watches see etcd gone")
            # the leader's lease runs out here: it stops leading though nobody can tell it
            await until(lambda: g.Deposed(old.led("q")[-1]) in old.told["q"], timeout=2 * TTL,
                        message="the leader deposed by its lease's loss")
            etcd_server.start()
            await group(all_nodes, "r")
            await until(lambda: one_leader(all_nodes, "r") is not None, timeout=15,
                        message="an election after the restart")
            await until(lambda: one_leader(all_nodes, "q") is not None, timeout=15,
                        message="one leader of the first group")
        assert not errors, errors

    run(scenario())


def test_a_compaction_while_the_watches_were_down_reloads_the_groups(etcd_server):
    async def scenario():
        async with started(etcd_server.endpoint, regrant=True) as all_nodes:
            await group(all_nodes, "q")
            await until(lambda: one_leader(all_nodes, "q") is not None, message="one leader")
            old = one_leader(all_nodes, "q")
            assert old is not None and old.lease is not None
            epoch = old.led("q")[-1]
            etcd_server.stop()
            # etcd back, and this loop held while the leader's lease goes and the
            # in-sync set leaves it out, then the history is compacted: the watches
            # resume from a compacted revision
            etcd_server.start()
            etcd_server.call("/v3/lease/revoke", {"ID": old.lease.id})
            others = [n.name for n in all_nodes if n is not old]
            written = etcd_server.call("/v3/kv/put", {
                "key": base64.b64encode(LAYOUT.group_isr(VHOST, "q")).decode(),
                "value": base64.b64encode(encode_group(InSync(others, epoch))).decode()})
            etcd_server.call("/v3/kv/compaction", {"revision": written["header"]["revision"]})
            await until(lambda: (new := one_leader(all_nodes, "q")) is not None
                        and new is not old, timeout=15, message="a new leader")
            assert g.Deposed(epoch) in old.told["q"]
            assert not [e for e in old.led("q") if e > epoch]
            for node in all_nodes:
                assert node.elections.views[(VHOST, "q")].in_sync == tuple(others)

    run(scenario())


def test_a_leader_that_leaves_steps_down_and_a_deleted_group_deposes_its_leader(etcd_server):
    async def scenario():
        async with started(etcd_server.endpoint) as all_nodes:
            a, b, c = all_nodes
            await group(all_nodes, "q")
            await until(lambda: one_leader(all_nodes, "q") is a, message="a leads")
            a.elections.leave(VHOST, "q")
            await until(lambda: one_leader([b, c], "q") is b, message="b leads once a left")
            assert a.told["q"] == [g.Leading(a.led("q")[0])]  # no role told once it left
            epoch = b.led("q")[-1]
            await c.elections.delete_group(VHOST, "q")
            await until(lambda: b.told["q"][-2:] == [g.Deposed(epoch), g.NoLeader()]
                        and c.role("q") == g.NoLeader(), message="the group's roles end")
            assert not (await b.etcd.range(LAYOUT.group_key(VHOST, "q")))[0]
            await until(lambda: (VHOST, "q") not in a.elections.views,
                        message="a, no member, forgets the deleted group")

    run(scenario())
