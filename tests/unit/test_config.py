"""The configuration (config.build): the command line over the file, and what it refuses."""

from __future__ import annotations

import pytest

from warren.gateway.config import ConfigError, build


def test_command_line_wins_over_the_file():
    config = build({"heartbeat": 30, "channel_max": 10}, {"heartbeat": "5"})
    assert (config.heartbeat, config.channel_max, config.frame_max) == (5, 10, 131072)
    with pytest.raises(ConfigError):
        build({"loopback_users": "guest"}, {})
