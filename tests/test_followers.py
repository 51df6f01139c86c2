"""Gateway 0's relay of mandatory direct replies between other gateway processes
(followers.Followers), in-process: each comes back to its publisher as delivered
or returned, also when the gateway it went to dies before saying."""

from __future__ import annotations

from warren.gateway.controllink import Reply, ReplyOutcome
from warren.gateway.followers import Followers
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
