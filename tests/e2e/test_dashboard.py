"""The web dashboard in a real headless Chromium, driven by Playwright, against a
real broker and real clients (pika): signing in and out, a queue's charts moving
while a publisher runs, purging, tables sorted and filtered, the forms and the
per-queue and per-connection pages.

The browser is Playwright's own build when `python -m playwright install
chromium` could fetch it, otherwise a system Chromium (Debian's `chromium`,
installed here with apt-get when the machine allows it); the tests are skipped,
saying why, only when there is none."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pika
import pytest

from ..support.broker import RunningBroker, managed_broker, wait_until

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="Playwright is not installed (pip install -e '.[test]')")
expect = sync_api.expect
# The figures the page shows are the root's, gathered from every gateway process
pytestmark = pytest.mark.most_gateways

TIMEOUT_MS = 30_000  # each wait for the page; it refreshes every 2 s in these tests
expect.set_options(timeout=TIMEOUT_MS)
# Chromium flags for a machine without a network or a GPU (and as root: no sandbox)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


def system_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def find_browser(playwright) -> str | None:
    """The executable to launch: None for Playwright's own build, else a system
    Chromium's path. Tries to install one of them first when neither exists."""
    if os.path.exists(playwright.chromium.executable_path):
        return None
    if system_chromium():
        return system_chromium()
    subprocess.run([sys.executable, "-m", "playwright", "install", "chromium"],
                   check=False, capture_output=True, timeout=600)
    if os.path.exists(playwright.chromium.executable_path):
        return None
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]
        def run(command):
            return subprocess.run(command, check=False, capture_output=True, env=env,
                                  timeout=900).returncode
        if run(install):
            run(["apt-get", "update"])
            run(install)
    found = system_chromium()
    if not found:
        pytest.skip("no Chromium: Playwright's download (python -m playwright install "
                    "chromium) failed and no system chromium is installed or installable")
    return found


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=find_browser(playwright),
                                              args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def warren(tmp_path_factory, gateway_count):
    yield from managed_broker(tmp_path_factory, "dashboard")


@pytest.fixture
def page(browser, warren, tmp_path):
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    context.add_init_script("localStorage.setItem('warren-refresh', '2000')")
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.on("dialog", lambda dialog: dialog.accept())  # "Purge …?", "Close …?"
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    page.screenshot(path=str(tmp_path / "last-page.png"), full_page=True)
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def sign_in(page, warren, password: str = "guest", where: str = "") -> None:
    page.goto(warren.http_url + "/" + where)
    page.fill("#user", "guest")
    page.fill("#password", password)
    page.click("#login button[type=submit]")


def http(warren, method: str, path: str, body=None) -> tuple[int, object]:
    request = urllib.request.Request(
        warren.http_url + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
                 "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as error:
        return error.code, None


def ready(warren, queue: str) -> int | None:
    return http(warren, "GET", f"/api/queues/%2F/{queue}")[1].get("messages_ready")


def declare(warren, queue: str, messages: int = 0, durable: bool = False) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    ch = conn.channel()
    ch.queue_declare(queue, durable=durable)
    ch.confirm_delivery()
    for _ in range(messages):
        ch.basic_publish("", queue, b"m")
    conn.close()
    wait_until(lambda: ready(warren, queue) == messages, timeout=10)


def series(page, chart: str, key: str) -> list[float]:
    values = page.get_attribute(f"#{chart} polyline[data-series={key}]", "data-values") or ""
    return [float(v) for v in values.split(",") if v]


class Publisher(threading.Thread):
    """Publishes to a queue, about 1000 messages a second, until stopped (or for
    two minutes at most)."""

    def __init__(self, url: str, queue: str):
        super().__init__(daemon=True)
        self.url, self.queue = url, queue
        self.stopping = threading.Event()
        self.sent = 0

    def run(self) -> None:
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        ch = conn.channel()
        deadline = time.monotonic() + 120
        while not self.stopping.is_set() and time.monotonic() < deadline:
            for _ in range(50):
                ch.basic_publish("", self.queue, b"x" * 100)
            self.sent += 50
            conn.process_data_events(0)
            self.stopping.wait(0.05)  # paces the publisher; nothing waits on a condition here
        conn.close()


def test_wrong_password_is_refused_with_an_error_then_sign_in_and_out(page, warren):
    sign_in(page, warren, password="not-the-password")
    expect(page.locator("#login-error")).to_have_text(
        "Login failed: wrong user name or password.")
    expect(page.locator("#app")).to_be_hidden()
    page.fill("#password", "guest")
    page.click("#login button[type=submit]")
    expect(page.locator("#login-error")).to_have_text("")
    expect(page.locator("#user-name")).to_contain_text("guest")
    expect(page.locator("#totals [data-card=Exchanges] b")).not_to_have_text("–")
    expect(page.locator("#nodes [data-field=mem_used]")).to_contain_text("iB")
    expect(page.locator("#nodes [data-field=disk_free_alarm]")).to_have_text("no alarm")
    page.click("#logout")
    expect(page.locator("#login")).to_be_visible()
    expect(page.locator("#app")).to_be_hidden()
    page.reload()  # the session is gone, not only hidden
    expect(page.locator("#login")).to_be_visible()
    expect(page.locator("#totals")).to_have_count(0)


def test_a_user_without_management_tags_is_told_why(page, warren):
    assert http(warren, "PUT", "/api/users/dash-app", {"password": "pw", "tags": ""})[0] == 201
    page.goto(warren.http_url + "/")
    page.fill("#user", "dash-app")
    page.fill("#password", "pw")
    page.click("#login button[type=submit]")
    expect(page.locator("#login-error")).to_have_text("Login refused: Not management user")
    expect(page.locator("#app")).to_be_hidden()


def test_a_management_user_sees_what_it_may_and_stays_signed_in(page, warren):
    assert http(warren, "PUT", "/api/users/dash-viewer",
                {"password": "pw", "tags": "management"})[0] == 201
    assert http(warren, "PUT", "/api/permissions/%2F/dash-viewer",
                {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))  # guest's, not its own
    try:
        name = wait_until(lambda: http(warren, "GET", "/api/connections")[1])[0]["name"]
        page.goto(warren.http_url + "/")
        page.fill("#user", "dash-viewer")
        page.fill("#password", "pw")
        page.click("#login button[type=submit]")
        expect(page.locator("#nodes")).to_have_text(
            "Node details are shown to users tagged monitoring or administrator.")
        page.goto(warren.http_url + "/#/connections/" + urllib.parse.quote(name, safe=""))
        # refused that one page (401 "not authorised"), but still signed in
        expect(page.locator("#updated")).to_have_text(
            "refresh failed: User not authorised to access object")
        expect(page.locator("#app")).to_be_visible()
        expect(page.locator("#user-name")).to_have_text("dash-viewer (management)")
    finally:
        conn.close()


def test_queue_charts_move_while_publishing_and_purge_empties_it(page, warren):
    declare(warren, "dash-orders")
    publisher = Publisher(warren.url, "dash-orders")
    sign_in(page, warren, where="#/queues/%2F/dash-orders")
    expect(page.locator("#view h2").first).to_have_text("Queue dash-orders in /")
    publisher.start()
    try:
        # the rate chart rises above zero and the depth chart grows, sample by sample
        wait_until(lambda: max(series(page, "queue-rates", "publish"), default=0) > 0,
                   timeout=30, interval=0.2, message="publish rate on the chart")
        def depth_grows():
            ready = series(page, "queue-depth", "ready")
            return len(ready) >= 2 and ready[-1] > ready[0]
        wait_until(depth_grows, timeout=30, interval=0.2, message="growing depth on the chart")
        legend = page.locator("#queue-rates .legend [data-series=publish]")
        expect(legend).not_to_have_attribute("data-value", "0")
    finally:
        publisher.stopping.set()
        publisher.join(timeout=30)
    wait_until(lambda: ready(warren, "dash-orders") == publisher.sent, timeout=30)
    expect(page.locator("#queue-details [data-field=messages_ready]")).to_have_text(
        f"{publisher.sent:,}")
    page.click("#purge")
    expect(page.locator("#flash")).to_have_text("Queue dash-orders purged.")
    expect(page.locator("#queue-details [data-field=messages_ready]")).to_have_text("0")
    wait_until(lambda: series(page, "queue-depth", "ready")[-1:] == [0.0], timeout=30,
               interval=0.2, message="the depth chart back at zero")
    assert ready(warren, "dash-orders") == 0


def test_queue_table_sorts_and_filters(page, warren):
    declare(warren, "sort-alpha-1", messages=3)
    declare(warren, "sort-alpha-2", messages=1)
    declare(warren, "sort-beta", messages=2)
    sign_in(page, warren, where="#/queues")
    names = page.locator("#queues tbody tr td:nth-child(2)")
    expect(names.filter(has_text="sort-beta")).to_have_count(1)
    page.fill(".filter", "sort-alpha")
    expect(names).to_have_text(["sort-alpha-1", "sort-alpha-2"])
    expect(page.locator(".count")).to_contain_text("2 of ")
    page.click("#queues th:text-is('Ready')")  # numbers sort largest first
    expect(names).to_have_text(["sort-alpha-1", "sort-alpha-2"])
    page.click("#queues th:text-is('Ready')")
    expect(names).to_have_text(["sort-alpha-2", "sort-alpha-1"])
    page.fill(".filter", "^sort-(beta|alpha-2)$")
    page.check(".toolbar input[type=checkbox]")
    expect(names).to_have_text(["sort-alpha-2", "sort-beta"])
    # the filter and the order stay while one visits a queue and comes back
    page.click("#queues a:text-is('sort-beta')")
    expect(page.locator("#view h2").first).to_have_text("Queue sort-beta in /")
    page.go_back()
    expect(names).to_have_text(["sort-alpha-2", "sort-beta"])
    page.fill(".filter", "no-such-queue")
    expect(page.locator("#queues tbody")).to_have_text("No item matches the filter.")


def test_forms_add_an_exchange_a_queue_and_a_binding(page, warren):
    sign_in(page, warren, where="#/exchanges")
    form = page.locator("#add-exchange")
    form.locator("[name=name]").fill("dash-events")
    form.locator("[name=type]").select_option("topic")
    form.locator("[name=arguments]").fill("not json")
    form.locator("button").click()
    expect(page.locator("#flash")).to_contain_text("Arguments must be a JSON object")
    form.locator("[name=arguments]").fill("")
    form.locator("button").click()
    expect(page.locator("#flash")).to_have_text("Exchange dash-events added.")
    expect(page.locator("#exchanges a", has_text="dash-events")).to_have_count(1)
    assert http(warren, "GET", "/api/exchanges/%2F/dash-events")[1]["type"] == "topic"

    page.click("#tabs a[data-tab=queues]")
    form = page.locator("#add-queue")
    form.locator("[name=name]").fill("dash-audit")
    form.locator("[name=arguments]").fill('{"x-max-length": 5}')
    form.locator("button").click()
    expect(page.locator("#flash")).to_have_text("Queue dash-audit added.")
    page.click("#queues a:text-is('dash-audit')")
    expect(page.locator("#queue-details")).to_contain_text('"x-max-length": 5')

    form = page.locator("#add-binding")
    form.locator("[name=source]").fill("dash-events")
    form.locator("[name=routing_key]").fill("audit.#")
    form.locator("button").click()
    expect(page.locator("#flash")).to_have_text("Bound dash-events to dash-audit.")
    expect(page.locator("#queue-bindings tbody tr", has_text="audit.#")).to_have_count(1)
    bindings = http(warren, "GET", "/api/bindings/%2F")[1]
    assert {"source": "dash-events", "destination": "dash-audit", "routing_key": "audit.#"} in [
        {k: b[k] for k in ("source", "destination", "routing_key")} for b in bindings]

    page.click("#delete-queue")
    expect(page.locator("#flash")).to_have_text("Queue dash-audit deleted.")
    assert http(warren, "GET", "/api/queues/%2F/dash-audit")[0] == 404


def test_default_exchange_page_lists_its_implicit_bindings(page, warren):
    declare(warren, "dash-direct-target")
    sign_in(page, warren, where="#/exchanges")
    page.click("#exchanges a:text-is('(AMQP default)')")
    expect(page.locator("#view h2").first).to_have_text("Exchange (AMQP default) in /")
    expect(page.locator("#view dl.details")).to_contain_text("direct")
    rows = page.locator("#exchange-bindings tbody tr")
    expect(rows.filter(has_text="dash-direct-target")).to_have_count(1)
    expect(page.locator("#add-binding")).to_have_count(0)  # nothing binds to it
    expect(page.locator("#delete-exchange")).to_have_count(0)


def test_connection_page_lists_channels_and_closes_the_connection(page, warren):
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    conn.channel()
    conn.channel().confirm_delivery()
    wait_until(lambda: len(http(warren, "GET", "/api/connections")[1]) == 1, timeout=10,
               message="(only this test's connection open)")
    try:
        sign_in(page, warren, where="#/connections")
        page.locator("#connections tbody a").first.click()
        expect(page.locator("#connection-channels tbody tr")).to_have_count(2)
        expect(page.locator("#connection-channels tbody")).to_contain_text("confirm")
        page.fill("[name=reason]", "closed from the dashboard test")
        page.click("#close-connection")
        expect(page.locator("#flash")).to_contain_text("closed.")

        def closed_by_broker():
            try:
                conn.process_data_events(0)
            except pika.exceptions.ConnectionClosedByBroker as error:
                return error
            return None
        error = wait_until(closed_by_broker, timeout=15, interval=0.05)
        assert error.reply_code == 320 and "closed from the dashboard test" in error.reply_text
    finally:
        if conn.is_open:
            conn.close()


def test_definitions_export_and_import(page, warren, tmp_path):
    declare(warren, "dash-exported", durable=True)  # definitions hold durable queues
    sign_in(page, warren, where="#/admin")
    with page.expect_download() as download:
        page.click("#export")
    exported = json.loads(download.value.path().read_text())
    assert "dash-exported" in [q["name"] for q in exported["queues"]]
    expect(page.locator("#flash")).to_contain_text("Definitions exported")

    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    page.set_input_files("#import [name=file]", str(bad))
    page.click("#import button")
    expect(page.locator("#flash")).to_have_text(
        "Importing definitions failed: broken.json is not a JSON file")

    good = tmp_path / "definitions.json"
    good.write_text(json.dumps({"queues": [{
        "name": "dash-imported", "vhost": "/", "durable": True, "auto_delete": False,
        "arguments": {}}]}))
    page.set_input_files("#import [name=file]", str(good))
    page.click("#import button")
    expect(page.locator("#flash")).to_have_text("Definitions imported from definitions.json.")
    assert http(warren, "GET", "/api/queues/%2F/dash-imported")[0] == 200


# -- publishing and getting from the pages ------------------------------------------------------

def publish_with_form(page, **fields: str) -> None:
    form = page.locator("#publish")
    for name, value in fields.items():
        form.locator(f"[name={name}]").fill(value)
    form.locator("button").click()


def test_publish_and_get_a_message_from_the_queue_page(page, warren):
    declare(warren, "dash-inbox")
    sign_in(page, warren, where="#/queues/%2F/dash-inbox")
    publish_with_form(page, payload="hello from the dashboard", headers='{"origin": "test"}')
    expect(page.locator("#flash")).to_have_text("Message published.")
    expect(page.locator("#queue-details [data-field=messages_ready]")).to_have_text("1")

    get = page.locator("#get-messages")
    get.locator("[name=ackmode]").select_option("ack_requeue_false")
    get.locator("button").click()
    expect(page.locator("#messages .payload")).to_have_text("hello from the dashboard")
    expect(page.locator("#messages")).to_contain_text('"origin": "test"')
    expect(page.locator("#queue-details [data-field=messages_ready]")).to_have_text("0")
    get.locator("button").click()
    expect(page.locator("#messages")).to_have_text("Queue is empty.")


def test_publish_from_an_exchange_page_says_when_nothing_was_routed(page, warren):
    sign_in(page, warren, where="#/exchanges/%2F/amq.direct")
    publish_with_form(page, routing_key="dash-nowhere", payload="lost")
    expect(page.locator("#flash")).to_have_text("Message published, but not routed.")


def test_overview_shows_a_disk_alarm_and_the_node_details(browser, tmp_path):
    # a free-disk limit larger than any disk: the alarm is on from the start
    alarmed = RunningBroker(tmp_path / "data", management=True,
                            extra_args=["--disk-free-limit", str(10**18)]).start()
    context = browser.new_context()
    try:
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        sign_in(page, alarmed)
        expect(page.locator("#alarms")).to_contain_text("Disk alarm on ")
        expect(page.locator("#alarms")).to_contain_text("Publishers are blocked.")
        expect(page.locator("#nodes [data-field=disk_free_alarm]")).to_have_text(
            "ALARM: publishers blocked")
        expect(page.locator("#nodes [data-field=mem_alarm]")).to_have_text("no alarm")
    finally:
        context.close()
        alarmed.stop()


# -- the admin tab's users, vhosts, permissions, policies and limits (issue 51, point 6) -------

def fill_form(page, form_id: str, **fields: str) -> None:
    """Fills the form's inputs and selects (a select once it offers the value), then
    submits it."""
    form = page.locator(f"#{form_id}")
    for name, value in fields.items():
        field = form.locator(f"[name={name}]")
        if field.evaluate("e => e.tagName") == "SELECT":
            field.select_option(value)  # waits for the option, which a refresh may add
        else:
            field.fill(value)
    form.locator("button").click()


def delete_row(page, label: str) -> None:
    page.click(f"button[aria-label='Delete {label}']")
    expect(page.locator("#flash")).to_have_text(f"Deleted {label}.")


def test_admin_adds_and_deletes_a_user_vhost_permission_policy_and_limits(page, warren):
    sign_in(page, warren, where="#/admin")
    fill_form(page, "add-user", name="dash-k-user", password="pw", tags="monitoring")
    expect(page.locator("#flash")).to_have_text("User dash-k-user added.")
    expect(page.locator("#admin-users tbody tr", has_text="dash-k-user")).to_contain_text(
        "monitoring")
    # edited from its row, without a password: its tags change and its password stays
    page.click("button[aria-label='Edit user dash-k-user']")
    expect(page.locator("#add-user [name=name]")).to_have_value("dash-k-user")
    expect(page.locator("#add-user [name=tags]")).to_have_value("monitoring")
    fill_form(page, "add-user", tags="management")
    expect(page.locator("#flash")).to_have_text("User dash-k-user updated.")
    assert http(warren, "GET", "/api/users/dash-k-user")[1]["tags"] == ["management"]
    whoami = urllib.request.Request(warren.http_url + "/api/whoami", headers={
        "Authorization": "Basic " + base64.b64encode(b"dash-k-user:pw").decode()})
    with urllib.request.urlopen(whoami, timeout=10) as response:
        assert json.loads(response.read())["name"] == "dash-k-user"

    fill_form(page, "add-vhost", name="dash-k-vhost", description="for the admin test")
    expect(page.locator("#flash")).to_have_text("Virtual host dash-k-vhost added.")
    assert http(warren, "GET", "/api/vhosts/dash-k-vhost")[1]["description"] == \
        "for the admin test"
    expect(page.locator("#vhost-filter option[value=dash-k-vhost]")).to_have_count(1)

    fill_form(page, "set-permission", user="dash-k-user", vhost="dash-k-vhost",
              configure="^dash-", write=".*", read="")
    expect(page.locator("#flash")).to_have_text(
        "Permissions of dash-k-user in dash-k-vhost set.")
    assert http(warren, "GET", "/api/permissions/dash-k-vhost/dash-k-user")[1] == {
        "user": "dash-k-user", "vhost": "dash-k-vhost", "configure": "^dash-", "write": ".*",
        "read": ""}

    fill_form(page, "add-policy", vhost="dash-k-vhost", name="dash-k-policy",
              pattern="^dash-", apply_to="queues", priority="3", definition="not json")
    expect(page.locator("#flash")).to_contain_text(
        "Add or update policy failed: Definition must be a JSON object")
    fill_form(page, "add-policy", vhost="dash-k-vhost", name="dash-k-policy",
              pattern="^dash-", apply_to="queues", priority="3",
              definition='{"max-length": 10}')
    expect(page.locator("#flash")).to_have_text("Policy dash-k-policy set in dash-k-vhost.")
    policy = http(warren, "GET", "/api/policies/dash-k-vhost/dash-k-policy")[1]
    assert {k: policy[k] for k in ("pattern", "apply-to", "priority", "definition")} == {
        "pattern": "^dash-", "apply-to": "queues", "priority": 3,
        "definition": {"max-length": 10}}
    page.click("button[aria-label='Edit policy dash-k-policy in dash-k-vhost']")
    expect(page.locator("#add-policy [name=definition]")).to_have_value('{"max-length":10}')
    fill_form(page, "add-policy", priority="5")
    expect(page.locator("#flash")).to_have_text("Policy dash-k-policy set in dash-k-vhost.")
    policy = http(warren, "GET", "/api/policies/dash-k-vhost/dash-k-policy")[1]
    assert (policy["priority"], policy["pattern"], policy["apply-to"]) == (5, "^dash-", "queues")

    fill_form(page, "set-vhost-limit", vhost="dash-k-vhost", limit="max-queues", value="7")
    expect(page.locator("#flash")).to_have_text("Limit max-queues of dash-k-vhost set.")
    assert http(warren, "GET", "/api/vhost-limits/dash-k-vhost")[1] == [
        {"vhost": "dash-k-vhost", "value": {"max-queues": 7}}]
    fill_form(page, "set-user-limit", user="dash-k-user", limit="max-connections", value="3")
    expect(page.locator("#flash")).to_have_text("Limit max-connections of dash-k-user set.")
    assert http(warren, "GET", "/api/user-limits/dash-k-user")[1] == [
        {"user": "dash-k-user", "value": {"max-connections": 3}}]

    # each deleted from its row, in the table and in the API
    delete_row(page, "limit max-connections of dash-k-user")
    assert http(warren, "GET", "/api/user-limits/dash-k-user")[1] == []
    delete_row(page, "limit max-queues of dash-k-vhost")
    assert http(warren, "GET", "/api/vhost-limits/dash-k-vhost")[1] == []
    delete_row(page, "policy dash-k-policy in dash-k-vhost")
    assert http(warren, "GET", "/api/policies/dash-k-vhost/dash-k-policy")[0] == 404
    delete_row(page, "permissions of dash-k-user in dash-k-vhost")
    assert http(warren, "GET", "/api/permissions/dash-k-vhost/dash-k-user")[0] == 404
    delete_row(page, "virtual host dash-k-vhost")
    assert http(warren, "GET", "/api/vhosts/dash-k-vhost")[0] == 404
    expect(page.locator("#vhost-filter option[value=dash-k-vhost]")).to_have_count(0)
    delete_row(page, "user dash-k-user")
    assert http(warren, "GET", "/api/users/dash-k-user")[0] == 404
    expect(page.locator("#admin-users tbody tr", has_text="dash-k-user")).to_have_count(0)


def test_a_non_administrator_is_told_who_manages_users(page, warren):
    assert http(warren, "PUT", "/api/users/dash-k-monitor",
                {"password": "pw", "tags": "monitoring"})[0] == 201
    page.goto(warren.http_url + "/#/admin")
    page.fill("#user", "dash-k-monitor")
    page.fill("#password", "pw")
    page.click("#login button[type=submit]")
    expect(page.locator("#managed")).to_contain_text("are managed by administrators")
    expect(page.locator("#add-user")).to_have_count(0)
    expect(page.locator("#add-policy")).to_have_count(0)


def test_a_policymaker_manages_policies_of_its_vhosts_only(page, warren):
    assert http(warren, "PUT", "/api/users/dash-k-policymaker",
                {"password": "pw", "tags": "policymaker"})[0] == 201
    assert http(warren, "PUT", "/api/permissions/%2F/dash-k-policymaker",
                {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    page.goto(warren.http_url + "/#/admin")
    page.fill("#user", "dash-k-policymaker")
    page.fill("#password", "pw")
    page.click("#login button[type=submit]")
    fill_form(page, "add-policy", vhost="/", name="dash-k-pm-policy", pattern="^pm-",
              definition='{"max-length": 2}')
    expect(page.locator("#flash")).to_have_text("Policy dash-k-pm-policy set in /.")
    assert http(warren, "GET", "/api/policies/%2F/dash-k-pm-policy")[1]["definition"] == {
        "max-length": 2}
    expect(page.locator("#add-user")).to_have_count(0)
    expect(page.locator("#managed")).to_contain_text("are managed by administrators")
    delete_row(page, "policy dash-k-pm-policy in /")
    assert http(warren, "GET", "/api/policies/%2F/dash-k-pm-policy")[0] == 404


# -- the charts' history, kept by the broker (issue 51, point 6) -------------------------------

HISTORY_QUERY = "lengths_age=60&lengths_incr=5&msg_rates_age=60&msg_rates_incr=5"


def test_the_api_answers_rabbitmqs_history_query_with_samples(warren):
    declare(warren, "dash-samples", messages=4)
    status, queue = http(warren, "GET", "/api/queues/%2F/dash-samples?" + HISTORY_QUERY)
    assert status == 200
    for details in (queue["messages_ready_details"], queue["messages_details"],
                    queue["message_stats"]["publish_details"]):
        assert set(details) == {"rate", "samples", "avg_rate", "avg"}
        assert len(details["samples"]) == 13  # 60 s by 5 s, both ends, as RabbitMQ's
        times = [s["timestamp"] for s in details["samples"]]
        assert times == sorted(times, reverse=True) and times[0] - times[1] == 5000
        assert details["samples"][0]["sample"] == 4
    overview = http(warren, "GET", "/api/overview?" + HISTORY_QUERY)[1]
    assert len(overview["queue_totals"]["messages_ready_details"]["samples"]) == 13
    assert len(overview["message_stats"]["confirm_details"]["samples"]) == 13
    assert "samples" not in http(warren, "GET", "/api/overview")[1]["message_stats"].get(
        "publish_details", {})
    # a user who sees only its vhosts gets their sums
    assert http(warren, "PUT", "/api/users/dash-k-sampler",
                {"password": "pw", "tags": "management"})[0] == 201
    assert http(warren, "PUT", "/api/permissions/%2F/dash-k-sampler",
                {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    request = urllib.request.Request(
        warren.http_url + "/api/overview?" + HISTORY_QUERY,
        headers={"Authorization": "Basic " + base64.b64encode(b"dash-k-sampler:pw").decode()})
    with urllib.request.urlopen(request, timeout=10) as response:
        theirs = json.loads(response.read())
    assert theirs["queue_totals"]["messages_ready_details"]["samples"][0]["sample"] == \
        theirs["queue_totals"]["messages_ready"] >= 4
    assert len(theirs["message_stats"]["publish_details"]["samples"]) == 13
    # a range RabbitMQ refuses, refused in its words
    request = urllib.request.Request(
        warren.http_url + "/api/overview?lengths_age=2505&lengths_incr=5",
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400
    assert json.loads(refused.value.read()) == {
        "error": "bad_request", "reason": "Invalid range parameters: age 2505, incr 5"}


def test_a_page_loaded_after_traffic_charts_the_minutes_before_at_once(page, warren):
    declare(warren, "dash-history", messages=30)

    def kept():  # a past sample, not only the present, holds the 30 messages
        queue = http(warren, "GET", "/api/queues/%2F/dash-history?" + HISTORY_QUERY)[1]
        return queue["messages_ready_details"]["samples"][1]["sample"] == 30
    wait_until(kept, timeout=15, interval=0.2, message="the broker's history of the queue")
    # one refresh a minute: every point but the last must come from the broker's history
    page.context.add_init_script("localStorage.setItem('warren-refresh', '60000')")
    sign_in(page, warren, where="#/queues/%2F/dash-history")
    expect(page.locator("#queue-depth polyline[data-series=ready]")).not_to_have_attribute(
        "data-values", "")
    ready = series(page, "queue-depth", "ready")
    assert len(ready) > 10 and ready[-1] == 30 and 30 in ready[:-1], ready
    assert max(series(page, "queue-rates", "publish")[:-1]) > 0
    expect(page.locator("#queue-depth")).not_to_contain_text("collecting samples")

    page.click("#tabs a[data-tab=overview]")
    expect(page.locator("#overview-depth polyline[data-series=ready]")).not_to_have_attribute(
        "data-values", "")
    assert len(series(page, "overview-depth", "ready")) > 10
    assert max(series(page, "overview-rates", "publish")) > 0
