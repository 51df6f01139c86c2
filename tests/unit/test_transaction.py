"""A channel's transaction state, in-process."""

from warren.gateway.session.transaction import Transaction, TxPublish, TxSettle


def publish(name: str) -> TxPublish:
    return TxPublish(name, b"p", b"body", -1, 0, ())


def test_commit_hands_back_the_actions_in_order_and_rollback_the_settled_deliveries():
    tx = Transaction()
    tx.publish(publish("m1"))
    tx.settle([(1, "d1"), (2, "d2")], 0)
    tx.publish(publish("m2"))
    assert tx.take() == [publish("m1"), TxSettle([(1, "d1"), (2, "d2")], 0), publish("m2")]
    assert tx.take() == []
    tx.settle([(3, "d3")], 0)
    tx.publish(publish("m3"))
    tx.settle([(4, "d4")], 2)
    assert tx.rollback() == [(3, "d3"), (4, "d4")]
    assert tx.take() == [] and not tx.stored.outstanding


def test_commit_ok_waits_until_every_shard_stored_its_part():
    tx = Transaction()
    seq = tx.stored.publish({0, 1})  # a committed publish to queues on shards 0 and 1
    assert not tx.stored_all()  # no commit waits yet
    assert not tx.carried_out()
    tx.stored.accept(seq, 0)
    assert not tx.stored_all()
    tx.stored.accept(seq, 1)
    assert tx.stored_all()
    assert not tx.stored_all()  # answered once
    assert not tx.committing and tx.stored.take_replies() == []


def test_a_commit_nothing_has_to_store_is_answered_at_once():
    tx = Transaction()
    tx.stored.publish(())  # routed nowhere
    assert tx.carried_out()
    assert not tx.committing and tx.stored.take_replies() == []
