"""Gateway 0's dealings with the other gateway processes (followers.Followers),
in-process: the relay of mandatory direct replies, each of which comes back to
its publisher as delivered or returned, also when the gateway it went to dies
before saying; and how a gateway that (re)starts is waited for and judged."""

from __future__ import annotations

import asyncio

from warren.gateway.broker.peermessages import Applied, Reply, ReplyOutcome, Serving
from warren.gateway.node.gateways import Followers
from warren.shards import records as r

ADDRESS = "amq.rabbitmq.reply-to.2.key"


class Gateway:
    """What Followers calls on gateway 0 for replies."""

    def __init__(self):
        self.outcomes: list[ReplyOutcome] = []
        self.delivered: list[Reply] = []

    def reply_outcome(self, outcome: ReplyOutcome) -> None:
        self.outcomes.append(outcome)

    def deliver_reply(self, reply: Reply) -> None:
        self.delivered.append(reply)


class Link:
    def __init__(self):
        self.sent: list = []

    def send(self, message) -> None:
        self.sent.append(message)


def channel_of(gateway: int) -> int:
    return 7 * r.MAX_GATEWAYS + gateway


def followers_with_links(*indexes: int) -> tuple[Followers, Gateway, dict[int, Link]]:
    gateway = Gateway()
    followers = Followers(gateway, len(indexes))
    links = {index: Link() for index in indexes}
    followers.links.update(links)
    return followers, gateway, links


def test_a_mandatory_reply_goes_on_and_its_outcome_comes_back_to_its_publisher():
    followers, gateway, links = followers_with_links(1, 2)
    reply = Reply(2, "", ADDRESS, b"\x00\x00", b"4", channel_of(1), 1)
    followers._message(1, reply)
    assert links[2].sent == [reply]
    outcome = ReplyOutcome(channel_of(1), 1, False)
    followers._message(2, outcome)
    assert gateway.outcomes == [outcome]  # which hands it to the publisher's gateway:
    followers.pass_outcome(outcome)
    assert links[1].sent == [outcome]
    # it is settled: the requester's gateway dying now returns nothing
    followers._lost(2, links[2])
    assert gateway.outcomes == [outcome]


def test_a_mandatory_reply_whose_gateway_dies_first_is_returned():
    followers, gateway, links = followers_with_links(1, 2)
    followers._message(1, Reply(2, "", ADDRESS, b"\x00\x00", b"4", channel_of(1), 1))
    followers._message(1, Reply(2, "", ADDRESS, b"\x00\x00", b"5"))  # not mandatory
    followers._lost(2, links[2])
    assert gateway.outcomes == [ReplyOutcome(channel_of(1), 1, True)]


def test_a_mandatory_reply_to_a_gateway_not_running_is_returned_at_once():
    followers, gateway, links = followers_with_links(1)
    followers._message(1, Reply(2, "", ADDRESS, b"\x00\x00", b"4", channel_of(1), 3))
    assert gateway.outcomes == [ReplyOutcome(channel_of(1), 3, True)]


def test_a_reply_whose_publisher_goes_is_forgotten():
    followers, gateway, links = followers_with_links(1, 2)
    followers._message(1, Reply(2, "", ADDRESS, b"\x00\x00", b"4", channel_of(1), 1))
    followers._lost(1, links[1])
    followers._lost(2, links[2])
    assert gateway.outcomes == []


class Process:
    """A gateway process as Followers sees it."""

    def __init__(self):
        self.killed = False

    def poll(self):
        return -9 if self.killed else None

    def kill(self) -> None:
        self.killed = True


def test_a_replacement_is_not_judged_on_changes_made_before_it_started():
    followers, gateway, links = followers_with_links(1, 2)
    old, other = Process(), Process()
    followers.processes.update({1: old, 2: other})
    followers.applied.update({1: 0, 2: 0})
    followers.seq = 7  # a declaration made then waits for both
    waited = {1: old, 2: other}
    followers._lost(1, links[1])  # gateway 1 died; its replacement starts
    new = followers.processes[1] = Process()
    followers.links[1] = Link()
    followers._check_applied(7, waited)  # APPLY_TIMEOUT later
    assert not new.killed  # not judged on what its predecessor was asked
    assert other.killed  # still the process waited for, and still behind


def test_a_starting_gateway_is_waited_for_and_handed_clients_once_it_has_the_catalogue():
    async def run():
        followers, gateway, links = followers_with_links(1, 2)
        followers.applied[2] = 3
        followers.seq = 3
        answers = []
        followers.request(None, answers.append)  # gateway 1 is starting: not waited for
        assert answers == [None]
        followers.seq = 5  # made while gateway 1 applied the catalogue as of change 4
        followers._message(1, Applied(4))
        followers._message(1, Serving(1))
        followers.request(None, answers.append)  # waits for gateway 1 now
        assert answers == [None] and followers.serving == set()  # lacks change 5
        followers._message(2, Applied(5))
        followers._message(1, Applied(5))
        assert answers == [None, None] and followers.serving == {1}

    asyncio.run(run())
