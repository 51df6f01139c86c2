"""Chaos (issue 17): kill -9 at random moments under confirmed persistent load.

Several confirm-mode publishers (tests/confirmpublisher.py) each fill a durable
queue, the queues spread over both shards. At moments picked by the round's seed
(counted in confirmed messages, not in seconds) the round kills single shard
processes (the gateway restarts them and the publishers carry on), the whole
broker at once, or both; a round that did not kill the whole broker ends by
killing its root process alone (kill -9). Then it starts the broker again,
without flags (a refused start fails the round: issue 56), and consumes
everything: no message a publisher was told is stored may be missing. Duplicates,
messages out of order and nacked messages that were stored all the same (a shard
that died after writing, before confirming) are counted and printed, not asserted
(a redelivery after a crash is allowed; test_e2e_durability.py holds the stricter
single-publisher kill tests).

    WARREN_CHAOS_ROUNDS=20 pytest -m soak -k chaos_kills_soak # 20 random rounds, not 100
    WARREN_CHAOS_SEED=4711 pytest tests/e2e/test_chaos_kill.py # replay one round
"""

from __future__ import annotations

import os
import random
import signal
import struct
import threading
from collections import Counter

import pytest

from ..support.amqpfuzz import env_int
from ..support.broker import RunningBroker, wait_until
from ..support.confirmpublisher import ConfirmPublisher
from .test_e2e_basic import names_on_every_shard, shard_pids
from .test_e2e_damage import broker_pids, wait_gone
from .test_e2e_durability import connect, drain

pytestmark = pytest.mark.slow  # started first: the two workers then finish together

SHARDS = 2
QUEUES = names_on_every_shard(SHARDS, per_shard=2, prefix="chaos")  # a publisher each
IN_FLIGHT = 400  # a publisher waits when this many of its messages are unanswered
PLANS = ("shard", "everything", "shard+everything")


class Load:
    """One thread per publisher: publish a batch, wait while too many are unanswered."""

    def __init__(self, port: int, rng: random.Random):
        self.publishers = [ConfirmPublisher(port, queue) for queue in QUEUES]
        self.batches = [rng.randint(1, 60) for _ in QUEUES]
        self.bodies = [b"b" * rng.choice([0, 10, 500, 4000]) for _ in QUEUES]
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(len(QUEUES))]
        for thread in self.threads:
            thread.start()

    def _run(self, i: int) -> None:
        publisher = self.publishers[i]
        try:
            while not self.stop.is_set() and not publisher.closed.is_set():
                publisher.publish(self.batches[i], body=self.bodies[i])
                wait_until(lambda: self.stop.is_set() or publisher.closed.is_set()
                           or publisher.sent - len(publisher.acked | publisher.nacked)
                           < IN_FLIGHT, timeout=30, message="(confirms stopped coming)")
        except OSError:
            pass  # the broker is gone: that is the chaos
        except AssertionError as error:
            self.errors.append(f"{QUEUES[i]}: {error}")

    def confirmed(self) -> int:
        return sum(len(p.acked) for p in self.publishers)

    def wait_for(self, more: int) -> None:
        """Let `more` further messages be confirmed: a random moment under load."""
        target = self.confirmed() + more
        wait_until(lambda: self.confirmed() >= target or self.errors, timeout=60,
                   message=f"(waiting for {target} confirms)")
        assert not self.errors, self.errors

    def finish(self, answered: bool) -> None:
        """Stop publishing; with `answered`, wait until every publish was answered."""
        self.stop.set()
        for thread in self.threads:
            thread.join(40)
        if answered:
            for p in self.publishers:
                wait_until(lambda: len(p.acked | p.nacked) == p.sent or p.closed.is_set(),
                           timeout=30, message=f"(answers for {p.queue})")
        for p in self.publishers:
            p.close()


def _kill_a_shard(broker: RunningBroker, rng: random.Random, wait: bool = True) -> None:
    victim = rng.choice(sorted(shard_pids(broker)))
    os.kill(victim, signal.SIGKILL)
    if wait:  # the gateway notices and starts a new one in its place
        wait_until(lambda: len(set(shard_pids(broker)) - {victim}) == SHARDS, timeout=30,
                   message="(the killed shard was not restarted)")


def _kill_the_root(broker: RunningBroker) -> set[int]:
    """kill -9 of the root alone: its gateways and shards notice and exit. The
    broker's processes, to wait for."""
    pids = broker_pids(broker)
    broker.process.kill()
    broker.process.wait(10)
    return pids


def _kill_everything(broker: RunningBroker) -> set[int]:
    pids = broker_pids(broker)
    for pid in [broker.process.pid, *shard_pids(broker)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # gone with the gateway (reaped, or saw it die)
            pass
    broker.process.wait(10)
    return pids


def chaos_round(tmp_path, seed: int) -> dict:
    rng = random.Random(seed)
    plan = PLANS[seed % len(PLANS)]
    data = tmp_path / f"chaos-{seed}"
    broker = RunningBroker(data, shards=SHARDS).start()
    kills = 0
    pids: set[int] = set()  # the broker's processes at the last kill
    try:
        load = Load(broker.port, rng)
        try:
            # Sometimes the whole broker dies while a killed shard is being restarted.
            at_once = plan == "shard+everything" and rng.random() < 0.5
            if "shard" in plan:
                rounds = rng.randint(1, 3)
                for n in range(rounds):
                    load.wait_for(rng.randint(20, 1500))
                    _kill_a_shard(broker, rng, wait=not (at_once and n == rounds - 1))
                    kills += 1
            if "everything" in plan:
                if not at_once:
                    load.wait_for(rng.randint(20, 1500))
                pids = _kill_everything(broker)
                kills += 1
            else:
                load.wait_for(rng.randint(20, 300))  # it carries on after the shard kills
                pids = _kill_the_root(broker)
                kills += 1
        finally:
            load.finish(answered=False)
        assert not load.errors, load.errors
    finally:
        broker.stop()
    publishers = load.publishers
    assert not any(p.answered_twice for p in publishers), "a publish was answered twice"
    assert not any(p.acked & p.nacked for p in publishers), "a publish was acked and nacked"

    # Recover (a restarted broker, without flags: the shards recover from their
    # stores) and consume everything.
    wait_gone(pids)
    broker = RunningBroker(data, shards=SHARDS).start()
    try:
        conn = connect(broker)
        ch = conn.channel()
        stored = {p.queue: [struct.unpack(">Q", body[:8])[0]
                            for body, _ in drain(ch, p.queue, timeout=120)]
                  for p in publishers}
        conn.close()
    finally:
        broker.stop()
    result = {"seed": seed, "plan": plan + (" at once" if at_once else ""), "kills": kills,
              "sent": sum(p.sent for p in publishers),
              "confirmed": sum(len(p.acked) for p in publishers),
              "nacked": sum(len(p.nacked) for p in publishers),
              "stored": sum(len(v) for v in stored.values()),
              "lost": 0, "duplicates": 0, "out_of_order": 0, "unconfirmed_stored": 0,
              "nacked_stored": 0}
    missing = {}
    for p in publishers:
        seqs = stored[p.queue]
        counts = Counter(seqs)
        result["duplicates"] += sum(n - 1 for n in counts.values())
        result["out_of_order"] += sum(1 for a, b in zip(seqs, seqs[1:]) if b < a)
        result["unconfirmed_stored"] += len(set(seqs) - p.acked)
        result["nacked_stored"] += len(set(seqs) & p.nacked)  # at-least-once: allowed
        lost = p.acked - set(seqs)
        result["lost"] += len(lost)
        if lost:
            missing[p.queue] = sorted(lost)[:20]
    print(f"\nchaos {result}")
    assert not missing, f"confirmed messages lost (replay: WARREN_CHAOS_SEED={seed}): {missing}"
    return result


def chaos_seeds(default) -> list[int]:
    """The rounds' seeds: WARREN_CHAOS_SEED's (comma-separated) to replay, else `default`."""
    replay = os.environ.get("WARREN_CHAOS_SEED", "").strip()
    return [int(s) for s in replay.split(",")] if replay else list(default)


def run_rounds(tmp_path, seeds: list[int]) -> None:
    totals = Counter()
    for seed in seeds:
        result = chaos_round(tmp_path, seed)
        totals.update({k: v for k, v in result.items() if isinstance(v, int) and k != "seed"})
        totals["rounds"] += 1
    print(f"\nchaos totals over {len(seeds)} rounds: {dict(totals)}")


# Four rounds, two per gateway count: seeds 1700-1703 are a shard round, an
# everything round, a shard+everything round and one that kills everything while
# a killed shard is being restarted; the first count runs 1700-1701, the second
# 1702-1703. WARREN_CHAOS_SEED's seeds replace them (run by the first round).
@pytest.mark.parametrize("round_", [0, 1])
def test_chaos_kills_lose_no_confirmed_message(tmp_path, round_, gateway_count):
    seeds = chaos_seeds([1700 + 2 * (gateway_count - 1) + round_])
    if seeds != [1700 + 2 * (gateway_count - 1) + round_] and round_:
        pytest.skip("replaying WARREN_CHAOS_SEED in the first round")
    run_rounds(tmp_path, seeds)


@pytest.mark.soak
def test_chaos_kills_soak(tmp_path):
    base = random.randrange(10**6)
    print(f"chaos soak: seeds from {base}")
    run_rounds(tmp_path, chaos_seeds(range(base, base + env_int("WARREN_CHAOS_ROUNDS", 100))))
