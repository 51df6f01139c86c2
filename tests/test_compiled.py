"""The compiled twins are built by the install wherever there is a C compiler, and
the broker uses them unless WARREN_PURE_PYTHON is set."""

from __future__ import annotations

import os
import shutil
import sysconfig

import pytest

from warren.gateway import shardlink, shardpool
from warren.gateway.amqp import frames, hotpath
from warren.shards import gatewayrings, main, model, outbox, queue, ring, shard

from . import twins


def test_the_compiled_twins_are_built_and_used_where_there_is_a_compiler():
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip("no C compiler here: the pure twins serve")
    assert twins.compiled is not None, "pip install built no warren.gateway.amqp._hotpath"
    assert ring.CompiledRing is not None, "pip install built no warren.shards._ring"
    compiled_link = twins.LINKS[-1].values[0]
    assert len(twins.LINKS) == len(twins.GATEWAY_RINGS) == len(twins.OUTBOXES) == 2, \
        "pip install built no compiled shardlink, gatewayrings or outbox"
    assert len(twins.QUEUE_BUILDS) == 2, "pip install built no compiled queue"
    compiled_queue = twins.QUEUE_BUILDS[-1].values[0]
    # extension types, their state typed by their .pxd (attributes are struct fields,
    # internal steps C functions)
    assert not hasattr(compiled_link, "_spend")
    assert not hasattr(compiled_queue.Queue, "_next_consumer")
    for built_class, attribute in ((compiled_link, "credit"),
                                   (twins.GATEWAY_RINGS[-1].values[0], "commands"),
                                   (twins.OUTBOXES[-1].values[0], "records"),
                                   (compiled_queue.Queue, "consumers"),
                                   (compiled_queue.Consumer, "credit")):
        assert type(vars(built_class)[attribute]).__name__ == "getset_descriptor"
    if os.environ.get("WARREN_PURE_PYTHON"):
        assert hotpath.deliver_frames is hotpath.pure_deliver_frames
        assert frames.FrameReader is frames.PureFrameReader
        assert ring.Ring is ring.PureRing
        assert shardpool.ShardLink is shardlink.ShardLink
        assert main.GatewayRings is gatewayrings.GatewayRings and shard.Outbox is outbox.Outbox
        assert model.queue is queue
    else:
        assert hotpath.deliver_frames is twins.compiled.deliver_frames
        assert frames.FrameReader is twins.compiled.FrameReader
        assert ring.Ring is ring.CompiledRing
        assert shardpool.ShardLink is compiled_link
        assert main.GatewayRings is twins.GATEWAY_RINGS[-1].values[0]
        assert shard.Outbox is twins.OUTBOXES[-1].values[0]
        assert model.queue is compiled_queue
