"""Load compaction's decision (node/compaction.Compaction), driven in-process: when
to pack the broker's processes onto one CPU and when to spread them again; and its
switch. tests/e2e/test_e2e_compaction.py has the shell on real processes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warren.gateway.config import build
from warren.gateway.node.compaction import CALM_SAMPLES, PACK_BELOW, SPREAD_ABOVE, Compaction

loads = st.floats(min_value=0.0, max_value=4.0, allow_nan=False)


@given(st.lists(loads, max_size=200))
def test_packs_only_after_a_calm_spell_and_spreads_on_the_first_busy_sample(samples):
    machine = Compaction()
    since_spread: list[float] = []
    for cores in samples:
        was_packed = machine.packed
        decision = machine.sample(cores)
        if was_packed:
            assert decision is (False if cores > SPREAD_ABOVE else None)
            if decision is False:
                since_spread = []
            continue
        since_spread.append(cores)
        calm = since_spread[-CALM_SAMPLES:]
        should_pack = len(calm) == CALM_SAMPLES and sum(calm) < PACK_BELOW * CALM_SAMPLES
        assert decision is (True if should_pack else None)
        assert machine.packed == should_pack


@given(loads)
def test_a_steady_load_never_flaps(cores):
    machine = Compaction()
    decisions = [d for d in (machine.sample(cores) for _ in range(10 * CALM_SAMPLES))
                 if d is not None]
    assert decisions == ([True] if cores < PACK_BELOW else [])


def test_the_switch_is_on_by_default_and_turns_off():
    assert build({}, {}).load_compaction is True
    assert build({}, {"load_compaction": "false"}).load_compaction is False
    assert build({"load_compaction": False}, {}).load_compaction is False
