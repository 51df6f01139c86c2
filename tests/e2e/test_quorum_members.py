"""A replicated quorum queue's members as a user sees them (issue 55), on one
shared three-node cluster: the management API's leader, members, online and
Warren's in_sync, and `warren ctl quorum_status` (GET /api/quorum-status/V/N),
one row per member with its state and the leader's shard's indexes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.error
from pathlib import Path

import pika
import pika.exceptions
import pytest

from warren.gateway.cluster import layout
from warren.storage.inspect import _ShardView

from ..support.cluster import PREFIX, Cluster, connect, consume_until, wait_for

pytestmark = [pytest.mark.run_once, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
QUORUM = {"x-queue-type": "quorum"}
PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("members")) as running:
        yield running
    running.assert_no_traceback()


def declare(node, queue: str, arguments: dict) -> None:
    connection = connect(node)
    try:
        connection.channel().queue_declare(queue, durable=True, arguments=arguments)
    finally:
        connection.close()


def publish(node, queue: str, count: int, prefix: str = "m") -> None:
    connection = connect(node)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for i in range(count):
            channel.basic_publish("", queue, f"{prefix}{i}".encode(), PERSISTENT,
                                  mandatory=True)
    finally:
        connection.close()


def ctl(node, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "warren.gateway.cli.main", "ctl", "--url",
                           node.http_url, *args], capture_output=True, text=True, timeout=30,
                          cwd=ROOT)


def status(node, queue: str) -> list[dict]:
    return node.api(f"quorum-status/%2F/{queue}")


def test_the_api_shows_the_in_sync_set(cluster):
    n1 = cluster.nodes[0]
    declare(n1, "shown", QUORUM)
    group = wait_for(lambda: (found := cluster.group("shown")).leader and
                     len(found.in_sync) == 3 and found, 10, "a leader, all in sync")
    for node in cluster.nodes:
        info = wait_for(lambda node=node: (found := node.api("queues/%2F/shown"))["leader"]
                        and found, 10, f"{node.name} shows the leader")
        assert info["leader"] == group.leader
        assert sorted(info["in_sync"]) == sorted(group.in_sync) == ["n1", "n2", "n3"]
        assert sorted(info["members"]) == sorted(info["online"]) == ["n1", "n2", "n3"]
    listed = {q["name"]: q for q in n1.api("queues/%2F")}
    assert sorted(listed["shown"]["in_sync"]) == ["n1", "n2", "n3"]


def test_quorum_status_rows_per_member(cluster):
    n1, n2, _ = cluster.nodes
    declare(n1, "status", QUORUM)
    wait_for(lambda: len(cluster.group("status").in_sync) == 3, 10, "all in sync")
    publish(n2, "status", 20)
    leader = cluster.group("status").leader

    def settled():
        rows = status(n2, "status")  # through a node, whichever leads
        return all(row["log_index"] and row["log_index"] == rows[0]["commit_index"]
                   for row in rows) and rows

    rows = wait_for(settled, 10, "every member's index reported and committed")
    assert sorted(row["node"] for row in rows) == ["n1", "n2", "n3"]
    states = {row["node"]: row["raft_state"] for row in rows}
    assert states[leader] == "leader"
    assert sorted(states.values()) == ["follower", "follower", "leader"]
    assert all(row["in_sync"] is True for row in rows)
    assert all(row["commit_index"] == row["log_index"] for row in rows)

    table = ctl(n1, "quorum_status", "status")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["node", "raft_state", "log_index", "commit_index", "in_sync"]
    body = [line.split() for line in lines[2:]]
    assert sorted(cells[0] for cells in body) == ["n1", "n2", "n3"]
    assert all(cells[4] == "yes" for cells in body)
    as_json = ctl(n1, "quorum_status", "status", "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert sorted(row["node"] for row in json.loads(as_json.stdout)) == ["n1", "n2", "n3"]


def test_quorum_status_refusals(cluster):
    n1 = cluster.nodes[0]
    declare(n1, "classic", {})
    with pytest.raises(urllib.error.HTTPError) as missing:
        status(n1, "no-such-queue")
    assert missing.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as classic:
        status(n1, "classic")
    assert classic.value.code == 400
    assert "Cannot get quorum status of a classic queue" in classic.value.read().decode()
    refused = ctl(n1, "quorum_status", "classic")
    assert refused.returncode == 1
    assert "Cannot get quorum status of a classic queue" in refused.stderr


def test_a_queue_of_one_member_is_a_group_that_grows(cluster):
    """As a Raft group of one of RabbitMQ's: it leads alone, then takes a member."""
    n1 = cluster.nodes[0]
    declare(n1, "alone", {**QUORUM, "x-quorum-initial-group-size": 1})
    publish(n1, "alone", 20)
    [row] = wait_for(lambda: (found := status(n1, "alone")) and found[0]["log_index"]
                     and found, 10, "its leader's indexes")
    home = n1.api("queues/%2F/alone")["node"]  # the node placement chose
    assert (row["node"], row["raft_state"], row["in_sync"]) == (home, "leader", True)
    assert row["commit_index"] == row["log_index"]
    other = next(node.name for node in cluster.nodes if node.name != home)
    added = ctl(n1, "add_member", "alone", other)
    assert added.returncode == 0, added.stderr
    wait_for(lambda: sorted(cluster.group("alone").in_sync) == sorted([home, other]), 15,
             "the new member caught up")
    removed = ctl(n1, "delete_member", "alone", home)
    assert removed.returncode == 0, removed.stderr
    wait_for(lambda: n1.api("queues/%2F/alone")["leader"] == other, 15, "the new member leads")
    expected = {f"m{i}".encode() for i in range(20)}
    assert consume_until(n1, "alone", expected, timeout=10) == expected


def publish_until(node, stop: threading.Event, acked: set[bytes]) -> None:
    """Confirmed publishes until `stop`: the bodies acked go into `acked`."""
    connection = connect(node)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        i = 0
        while not stop.is_set():
            body = f"during{i}".encode()
            i += 1
            try:
                channel.basic_publish("", "grown", body, PERSISTENT)
                acked.add(body)
            except pika.exceptions.NackError:
                pass
    finally:
        connection.close()


def test_a_member_added_catches_up_and_one_removed_leaves(cluster):
    n1, n2, n3 = cluster.nodes
    declare(n1, "grown", {**QUORUM, "x-quorum-initial-group-size": 2})
    members = wait_for(lambda: (found := n1.api("queues/%2F/grown"))["leader"] and
                       len(found["in_sync"]) == 2 and found["members"], 10, "two in sync")
    [outside] = [node.name for node in cluster.nodes if node.name not in members]
    publish(n2, "grown", 30)

    added = ctl(n3, "add_member", "grown", outside)
    assert added.returncode == 0, added.stderr
    assert added.stdout == f"Adding a replica for queue grown on node {outside}...\n"
    wait_for(lambda: sorted(cluster.group("grown").in_sync) == ["n1", "n2", "n3"], 15,
             "the new member caught up and in sync")
    rows = wait_for(lambda: (found := status(n1, "grown")) and len({
        row["log_index"] for row in found}) == 1 and found, 10, "every member holds the log")
    assert sorted(row["node"] for row in rows) == ["n1", "n2", "n3"]
    again = ctl(n1, "add_member", "grown", outside)  # a member already: no error
    assert again.returncode == 0, again.stderr

    leader = cluster.group("grown").leader
    follower = next(name for name in members if name != leader)
    removed = ctl(n2, "delete_member", "grown", follower)
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout == f"Removing a replica of queue grown on node {follower}...\n"
    wait_for(lambda: follower not in cluster.group("grown").in_sync
             and follower not in n1.api("queues/%2F/grown")["members"], 10, "it left")
    publish(n1, "grown", 5, "after")  # confirmed by the two members left
    # The leader removed: another one leads, and what is published meanwhile
    # through the old one's node is acked by a leader, or nacked: none is lost.
    by_name = {node.name: node for node in cluster.nodes}
    acked: set[bytes] = set()
    stop = threading.Event()
    publisher = threading.Thread(target=publish_until, args=(by_name[leader], stop, acked))
    publisher.start()
    try:
        wait_for(lambda: len(acked) >= 10, 10, "publishing")
        moved = ctl(n1, "delete_member", "grown", leader)
        assert moved.returncode == 0, moved.stderr
        wait_for(lambda: cluster.group("grown").leader not in (None, leader), 15,
                 "a new leader")
        count = len(acked)
        wait_for(lambda: len(acked) >= count + 10, 10, "publishing to the new leader")
    finally:
        stop.set()
        publisher.join()
    [last] = wait_for(lambda: len(found := n1.api("queues/%2F/grown")["members"]) == 1
                      and found, 10, "one member left")
    wait_for(lambda: n1.api("queues/%2F/grown")["leader"] == last, 10, "routed to it")
    first = {f"m{i}".encode() for i in range(30)} | {f"after{i}".encode() for i in range(5)}
    expected = first | acked
    assert consume_until(n2, "grown", expected, timeout=10) >= expected
    refused = ctl(n1, "delete_member", "grown", last)
    assert (refused.returncode, refused.stderr) == (69, "Error: last_node\n")


def test_member_changes_refused_as_rabbitmq_does(cluster):
    n1 = cluster.nodes[0]
    declare(n1, "plain", {})
    declare(n1, "replicated", QUORUM)
    for args, error in ((("add_member", "plain", "n2"),
                         "Cannot add members to a classic queue"),
                        (("add_member", "nowhere", "n2"), "not_found"),
                        (("add_member", "replicated", "n9"), "node_not_running")):
        result = ctl(n1, *args)
        assert (result.returncode, result.stderr) == (69, f"Error: {error}\n"), args
    assert ctl(n1, "delete_member", "replicated", "n9").returncode == 0  # not a member


def test_shrink_and_grow_a_node(cluster):
    n1, n2, n3 = cluster.nodes
    declare(n1, "spread-a", QUORUM)
    declare(n1, "spread-b", QUORUM)
    declare(n1, "solo", {**QUORUM, "x-quorum-initial-group-size": 2})
    wait_for(lambda: all(len(cluster.group(q).in_sync) == size for q, size in
                         (("spread-a", 3), ("spread-b", 3), ("solo", 2))), 10, "all in sync")
    gone, solo_node = n1.api("queues/%2F/solo")["members"]
    assert ctl(n1, "delete_member", "solo", gone).returncode == 0
    wait_for(lambda: n1.api("queues/%2F/solo")["members"] == [solo_node], 10, "one member")
    shrunk = ctl(n1, "shrink", solo_node, "--json")
    assert shrunk.returncode == 0, shrunk.stderr
    rows = {row["name"]: row for row in json.loads(shrunk.stdout)}
    assert rows["solo"] == {"vhost": "/", "name": "solo", "size": 1,
                            "result": "error: the last node cannot be removed"}
    assert rows["spread-a"]["result"] == rows["spread-b"]["result"] == "ok"
    assert rows["spread-a"]["size"] == 2
    wait_for(lambda: solo_node not in n1.api("queues/%2F/spread-a")["members"], 10, "shrunk")
    errors = ctl(n2, "shrink", solo_node, "--errors-only")
    assert errors.returncode == 0, errors.stderr
    lines = errors.stdout.splitlines()
    assert lines[0] == f"Shrinking quorum queues on {solo_node}..."
    assert ["/", "solo", "1"] in [line.split()[:3] for line in lines[3:]]
    assert all("error: the last node cannot be removed" in line for line in lines[3:])

    even = ctl(n1, "grow", solo_node, "even", "--queue-pattern", "^spread-a$", "--json")
    assert even.returncode == 0, even.stderr
    assert json.loads(even.stdout) == [{"vhost": "/", "name": "spread-a", "size": 3,
                                        "result": "ok"}]
    wait_for(lambda: len(cluster.group("spread-a").in_sync) == 3, 15, "grown and in sync")
    grown = ctl(n1, "grow", solo_node, "all", "--vhost-pattern", "^/$")
    assert grown.returncode == 0, grown.stderr
    assert grown.stdout.startswith(f"Growing all quorum queues on {solo_node}...\n")
    assert "spread-b" in grown.stdout and "spread-a" not in grown.stdout
    wait_for(lambda: len(cluster.group("spread-b").in_sync) == 3, 15, "grown and in sync")
    wrong = ctl(n1, "grow", solo_node, "some")
    assert (wrong.returncode, wrong.stderr) == (
        64, "Error (argument validation): \"strategy 'some' is not recognised.\"\n")


def test_rows_of_a_queue_left_or_deleted_while_a_node_was_down_go_at_its_return(cluster):
    """Removed from one group and another group deleted while its node was stopped:
    at its start the node's shard drops the rows it kept of both."""
    n1, n2, n3 = cluster.nodes
    for queue in ("departed", "vanished"):  # both led by n1
        declare(n1, queue, {**QUORUM, "x-queue-leader-locator": "client-local"})
        publish(n1, queue, 20)
    wait_for(lambda: all(sorted(cluster.group(q).in_sync) == ["n1", "n2", "n3"]
                         for q in ("departed", "vanished")), 15, "all in sync")
    keys = layout.Layout(PREFIX)
    qids = [layout.decode(cluster._get(keys.queue_key("/", q))["value"]).definition.qid
            for q in ("departed", "vanished")]
    down = n3
    down.stop()
    store = str(down.data_dir / "shard-0")

    def held() -> list[int]:
        view = _ShardView(store)
        try:
            return [view.counts(qid)[0] for qid in qids]
        finally:
            view.env.close()
    assert held() == [20, 20]  # (else this test tests nothing)
    assert ctl(n1, "delete_member", "departed", down.name).returncode == 0
    connection = connect(n1)
    connection.channel().queue_delete("vanished")
    connection.close()
    down.start()
    for qid in qids:
        wait_for(lambda qid=qid: f"queue {qid}'s rows in shard 0 deleted" in down.log_text(),
                 15, f"queue {qid} swept")
    down.stop()
    assert held() == [0, 0]
    down.start()
    wait_for(lambda: all(len(n.running_nodes()) == 3 for n in cluster.nodes), 30, "all running")


def test_a_queue_between_leaders_is_declared_counting_nothing_as_rabbitmq_does(cluster):
    """Its only member's node stopped: a declaration through another node, passive
    or not, is answered (0 messages, 0 consumers), as RabbitMQ answers it; a get
    is 404 (RabbitMQ closes the connection with 541)."""
    n1, n2, n3 = cluster.nodes
    arguments = {**QUORUM, "x-quorum-initial-group-size": 1,
                 "x-queue-leader-locator": "client-local"}
    declare(n3, "stranded", arguments)
    publish(n3, "stranded", 3)
    n3.stop()
    try:
        wait_for(lambda: "n3" not in n1.running_nodes(), 15, "n3 seen down")
        connection = connect(n1)
        channel = connection.channel()
        ok = channel.queue_declare("stranded", passive=True).method
        assert (ok.message_count, ok.consumer_count) == (0, 0)
        ok = channel.queue_declare("stranded", durable=True, arguments=arguments).method
        assert (ok.queue, ok.message_count) == ("stranded", 0)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.basic_get("stranded")
        assert refused.value.reply_code == 404
        assert connection.is_open
        connection.close()
    finally:
        n3.start()
        wait_for(lambda: all(len(n.running_nodes()) == 3 for n in cluster.nodes), 30,
                 "all running")
    connection = connect(n1)
    assert wait_for(lambda: connection.channel().queue_declare(
        "stranded", passive=True).method.message_count == 3, 15, "its leader back")
    connection.close()
