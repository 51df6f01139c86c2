"""The web dashboard in headless Chromium: it signs in, fetches the API and shows
the queues, connections and consumers. Debian's chromium is installed by this
test when it is missing and the machine allows it; otherwise the test is skipped
and says why."""

from __future__ import annotations

import os
import shutil
import subprocess

import pika
import pytest

from .conftest import RunningBroker, wait_until

CHROMIUM = "/usr/bin/chromium"


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("Chromium is not installed and this test cannot install it "
                    "(needs root and apt-get for Debian's chromium package)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]
    result = subprocess.run(install, capture_output=True, text=True, env=env, timeout=900)
    if result.returncode != 0:
        subprocess.run(["apt-get", "update"], capture_output=True, env=env, timeout=300)
        result = subprocess.run(install, capture_output=True, text=True, env=env, timeout=900)
    found = shutil.which("chromium")
    if not found:
        pytest.skip(f"installing Debian's chromium failed: {result.stderr[-300:]}")
    return found


def headless(browser: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                           "--disable-dev-shm-usage", "--hide-scrollbars",
                           "--virtual-time-budget=8000", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_dashboard_shows_queues_connections_and_consumers(tmp_path):
    browser = chromium()
    broker = RunningBroker(tmp_path / "data", management=True).start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        ch.queue_declare("dashboard-orders")
        ch.confirm_delivery()
        for _ in range(3):
            ch.basic_publish("", "dashboard-orders", b"x")
        ch.queue_declare("dashboard-audit")
        ch.basic_consume("dashboard-audit", lambda *a: None, consumer_tag="auditor")
        url = broker.http_url + "/#guest:guest"
        dom = headless(browser, "--dump-dom", url).stdout
        assert "dashboard-orders" in dom and "dashboard-audit" in dom
        assert "auditor" in dom  # the consumers table
        assert "<td>guest</td>" in dom  # the connections table
        shot = tmp_path / "dashboard.png"
        headless(browser, f"--screenshot={shot}", "--window-size=1280,900", url)
        wait_until(lambda: shot.exists() and shot.stat().st_size > 10_000, timeout=30)
        print(f"dashboard screenshot: {shot}")
        # without credentials the page asks for them instead of showing data
        login = headless(browser, "--dump-dom", broker.http_url + "/").stdout
        assert "Sign in" in login and "dashboard-orders" not in login
        conn.close()
    finally:
        broker.stop()
