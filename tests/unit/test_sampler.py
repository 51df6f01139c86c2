"""The management API's counter sampler stops when the broker stops, even when
the cancel is swallowed by one of its waits (Python 3.11's asyncio.wait_for does
that when the awaited answer arrives at the same moment): a sampler that went on
would keep `warren serve` from exiting."""

from __future__ import annotations

import asyncio

from warren.gateway.management import sampling
from warren.gateway.management.sampling import Sampler


class SwallowingSampler(Sampler):
    def __init__(self):
        super().__init__(gateway=None, connections=list)
        self.samples = 0

    async def sample(self) -> None:
        self.samples += 1
        if self.samples > 1:  # it went on after the cancel: end it, so the test fails
            raise asyncio.CancelledError
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # as wait_for does when its future completed meanwhile


def test_a_cancelled_sampler_stops_even_if_a_wait_swallows_the_cancel(monkeypatch):
    monkeypatch.setattr(sampling, "SAMPLE_INTERVAL", 0)

    async def scenario() -> int:
        sampler = SwallowingSampler()
        task = asyncio.get_running_loop().create_task(sampler.keep_sampling())
        while not sampler.samples:
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.wait([task], timeout=5.0)
        return sampler.samples

    assert asyncio.run(scenario()) == 1
