"""A channel's transaction state, in-process."""

from warren.gateway.transaction import PUBLISH, SETTLE, Transaction


def test_commit_hands_back_the_actions_in_order_and_rollback_the_settled_deliveries():
    tx = Transaction()
    tx.publish("m1", b"p", b"b1")
    tx.settle([(1, "d1"), (2, "d2")], 0)
    tx.publish("m2", b"p", b"b2")
    assert [kind for kind, _ in tx.take()] == [PUBLISH, SETTLE, PUBLISH]
    assert tx.take() == []
    tx.settle([(3, "d3")], 0)
    tx.publish("m3", b"p", b"b3")
    tx.settle([(4, "d4")], 2)
    assert tx.rollback() == [(3, "d3"), (4, "d4")]
    assert tx.take() == [] and not tx.stored.outstanding
