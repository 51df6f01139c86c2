"""Noticing that a child process exited: by pidfd, and by a waiting thread where
the kernel has no pidfd_open (before Linux 5.3, some sandboxes, valgrind)."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import subprocess
import sys
import threading

import pika
import pytest

from warren.gateway.io.exitwatch import ExitWatch

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


@pytest.fixture(params=["pidfd", "thread"])
def way(request, monkeypatch) -> str:
    if request.param == "thread":
        monkeypatch.setattr(os, "pidfd_open", lambda *_: (_ for _ in ()).throw(
            OSError(errno.ENOSYS, "Function not implemented")))
    return request.param


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def test_the_exit_is_told_once_and_its_status_stays_for_popen(way):
    async def main() -> tuple[list, int]:
        loop = asyncio.get_running_loop()
        told = []
        process = _child("import sys, time; time.sleep(0.2); sys.exit(3)")
        watch = ExitWatch(loop, process, lambda: told.append(process.poll()))
        assert watch.by_pidfd == (way == "pidfd")
        while not told:
            await asyncio.sleep(0.01)
        for _ in range(3):
            await asyncio.sleep(0)
        return told, process.wait(5)

    told, returncode = asyncio.run(asyncio.wait_for(main(), 20))
    assert told == [3]  # the child was still there to be reaped by its Popen
    assert returncode == 3


def test_a_cancelled_watch_tells_nothing(way):
    async def main() -> list:
        loop = asyncio.get_running_loop()
        told = []
        process = _child("import time; time.sleep(30)")
        watch = ExitWatch(loop, process, lambda: told.append(True))
        watch.cancel()
        process.kill()
        process.wait(5)  # reaped here: the waiting thread finds nothing left to wait for
        await asyncio.sleep(0)
        while any(t.name == f"exitwatch-{process.pid}" for t in threading.enumerate()):
            await asyncio.sleep(0.01)
        for _ in range(3):
            await asyncio.sleep(0)
        return told

    assert asyncio.run(asyncio.wait_for(main(), 20)) == []


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
