"""A broker where the kernel has no pidfd_open (before Linux 5.3, some sandboxes,
valgrind) notices its children's exits by a waiting thread: it restarts its shards
and gateways (tests/unit/test_exitwatch.py: ExitWatch itself)."""

from __future__ import annotations

import os
import signal

import pika
import pytest

from ..support.broker import RunningBroker, wait_until
from .test_e2e_basic import shard_pids
from .test_e2e_gateways import connect, gateway_pid, restarted_shard

pytestmark = pytest.mark.run_once  # its brokers choose their gateway processes

NO_PIDFD = '''
import errno, os
def _refused(pid, flags=0):
    raise OSError(errno.ENOSYS, "Function not implemented")
os.pidfd_open = _refused
'''


def test_a_broker_without_pidfds_restarts_its_shards_and_gateways(tmp_path, monkeypatch):
    """Where pidfd_open fails, the broker still starts, and a killed shard and a
    killed gateway are noticed and restarted, the confirmed message kept."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_PIDFD)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]))
    broker = RunningBroker(tmp_path / "data", shards=1, gateways=2).start()
    try:
        conn = connect(broker, 1)
        ch = conn.channel()
        ch.queue_declare("nopidfd", durable=True)
        ch.confirm_delivery()
        ch.basic_publish("", "nopidfd", b"kept", pika.BasicProperties(delivery_mode=2))
        conn.close()
        [pid] = shard_pids(broker)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: restarted_shard(broker, pid), 30, message="the shard restarted")
        broker.forget_gateway_port(2)
        os.kill(gateway_pid(broker, 2), signal.SIGKILL)
        wait_until(lambda: broker.log_text().count("gateway 2 started") == 2, 30,
                   message="gateway 2 restarted")

        def got() -> bytes | None:
            try:
                conn = connect(broker, 2)
                _, _, body = conn.channel().basic_get("nopidfd", auto_ack=True)
                conn.close()
                return body
            except pika.exceptions.AMQPError:
                return None

        assert wait_until(got, 30, message="the message, through the restarted gateway") \
            == b"kept"
    finally:
        broker.stop()
