"""Celery over Warren: a real worker (started by the test) runs tasks sent with
kombu, and results come back through the rpc:// result backend."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

celery = pytest.importorskip("celery", reason="celery is installed by the test extra")

TASKS = textwrap.dedent('''
    import os
    from celery import Celery

    app = Celery("tasks", broker=os.environ["WARREN_URL"], backend="rpc://")
    app.conf.broker_connection_retry_on_startup = True
    app.conf.task_acks_late = True

    @app.task
    def add(x, y):
        return x + y

    @app.task(bind=True, max_retries=2, default_retry_delay=0.05)
    def flaky(self, key):
        marker = os.path.join(os.environ["WARREN_TMP"], key)
        tries = int(open(marker).read()) if os.path.exists(marker) else 0
        with open(marker, "w") as f:
            f.write(str(tries + 1))
        if tries < 2:
            raise self.retry(exc=RuntimeError("not yet"))
        return tries
''')


@pytest.fixture
def celery_app(broker, tmp_path, monkeypatch):
    (tmp_path / "tasks.py").write_text(TASKS)
    env = {**os.environ, "WARREN_URL": broker.url.replace("amqp://", "pyamqp://"),
           "WARREN_TMP": str(tmp_path), "PYTHONPATH": str(tmp_path)}
    monkeypatch.setenv("WARREN_URL", env["WARREN_URL"])
    monkeypatch.setenv("WARREN_TMP", str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    log = open(tmp_path / "worker.log", "wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tasks", "worker", "--pool=solo",
         "--loglevel=INFO", "--hostname", f"w-{os.getpid()}@localhost"],
        cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    import tasks  # the same module the worker runs
    yield tasks
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(20)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
    log.close()
    sys.modules.pop("tasks", None)
    tasks.app.close()


def test_celery_worker_runs_tasks_and_results_come_back(celery_app, tmp_path):
    try:
        results = [celery_app.add.delay(i, i) for i in range(10)]
        assert [r.get(timeout=60) for r in results] == [2 * i for i in range(10)]
        # retries go back through the broker (countdown uses the worker's timers)
        assert celery_app.flaky.delay("k").get(timeout=60) == 2
    except Exception:
        print((tmp_path / "worker.log").read_text(errors="replace")[-5000:])
        raise
