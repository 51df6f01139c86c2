"""Running an asyncio scenario from a test, and waiting in it with a deadline."""

from __future__ import annotations

import asyncio
import time


def run(scenario, timeout: float = 120.0) -> None:
    asyncio.run(asyncio.wait_for(scenario, timeout))


async def until(condition, timeout: float = 10.0, message: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {message}")
        await asyncio.sleep(0.01)
