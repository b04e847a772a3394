"""The web console in headless Chromium against a real `headrace up` (issue 18): a source and a view created from
the SQL editor, webhooks posted (by a client and by the page's test form) and their counts, a rejected request with
its reason, a SUBSCRIBE table that updates live, a failing sink's error, the objects with their SQL. Each page's
screenshot is saved under the test's temporary directory (the path is printed)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from tests.console.browser import Browser
from tests.e2e.server_process import HeadraceProcess

pytestmark = pytest.mark.e2e

SOURCE = "orders"
VIEW = "order_totals"


# The bootstrap superuser is trusted on loopback (the tests' SQL); every other role must give its password, which the
# console then asks for.
AUTH_RULES = "headrace@loopback=trust,all=scram-sha-256"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HeadraceProcess]:
    process = HeadraceProcess(Path(tmp_path_factory.mktemp("console")) / "data", ("--auth", AUTH_RULES))
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    chromium = Browser(Path(tmp_path_factory.mktemp("chromium")))
    yield chromium.driver
    chromium.quit()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Callable[[WebDriver, str], Path]:
    folder = Path(tmp_path_factory.mktemp("console-screenshots"))
    print(f"\nconsole screenshots: {folder}")

    def take(driver: WebDriver, name: str) -> Path:
        path = folder / f"{name}.png"
        driver.save_screenshot(str(path))
        print(f"screenshot: {path}")
        return path

    return take


def console(server: HeadraceProcess, page: str) -> str:
    return f"http://127.0.0.1:{server.http_port}/#/{page}"


def wait_until(driver: WebDriver, condition: Callable[[WebDriver], object], timeout: float = 60.0,
               message: Callable[[], str] | str = "") -> object:
    """`condition`'s first truthy value; on a time-out, an AssertionError with `message` (called then, if callable)."""
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.25).until(condition)
    except TimeoutException:
        raise AssertionError(f"timed out after {timeout} s: {message() if callable(message) else message}") from None


def text_of(driver: WebDriver, css: str) -> str:
    """The rendered text of the first element `css` matches, read in one step in the page (the pages redraw every
    few seconds: an element found first and read after could be gone)."""
    return str(driver.execute_script("return document.querySelector(arguments[0])?.innerText ?? ''", css))


def texts_of(driver: WebDriver, css: str) -> list[str]:
    return list(driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((node) => node.innerText)", css))


def run_sql_in_editor(driver: WebDriver, server: HeadraceProcess, sql: str) -> WebElement:
    if not driver.current_url.endswith("#/sql"):
        driver.get(console(server, "sql"))
    editor = wait_until(driver, lambda d: d.find_element(By.ID, "sql-input"))
    editor.clear()
    editor.send_keys(sql)
    driver.find_element(By.ID, "sql-run").click()
    return driver.find_element(By.ID, "sql-results")


def post(server: HeadraceProcess, body: bytes, key: str | None = None) -> int:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    request = urllib.request.Request(server.webhook_url(SOURCE), data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def test_create_a_source_and_a_view_from_the_sql_editor(server: HeadraceProcess, browser: WebDriver,
                                                        screenshots: Callable[[WebDriver, str], Path]) -> None:
    results = run_sql_in_editor(browser, server,
        f"CREATE SOURCE {SOURCE} FROM WEBHOOK BODY FORMAT JSON INCLUDE HEADERS IDEMPOTENT (headers->>'idempotency-key');\n"
        f"CREATE MATERIALIZED VIEW {VIEW} AS SELECT body->>'customer' AS customer, count(*) AS orders, "
        f"sum((body->>'amount')::int) AS amount FROM {SOURCE} GROUP BY 1;\nSELECT 6 * 7 AS answer;")
    wait_until(browser, lambda d: "SELECT 1" in results.text, message=lambda: results.text)
    tags = [node.get_attribute("data-tag") for node in results.find_elements(By.CSS_SELECTOR, ".result-caption")]
    assert tags == ["CREATE SOURCE", "CREATE MATERIALIZED VIEW", "SELECT 1"]
    assert "answer" in results.text and "42" in results.text
    screenshots(browser, "sql-editor")
    # An error is shown with its SQLSTATE, and the session goes on.
    results = run_sql_in_editor(browser, server, "SELECT * FROM no_such_relation;")
    wait_until(browser, lambda d: "42P01" in results.text, message=lambda: results.text)


def test_webhook_counts_and_a_rejected_request_with_its_reason(server: HeadraceProcess, browser: WebDriver,
                                                                screenshots: Callable[[WebDriver, str], Path]) -> None:
    assert post(server, json.dumps({"customer": "c1", "amount": 1200}).encode(), "evt-1") == 200
    assert post(server, json.dumps({"customer": "c1", "amount": 1200}).encode(), "evt-1") == 200  # a duplicate
    assert post(server, json.dumps({"customer": "c2", "amount": 500}).encode(), "evt-2") == 200
    assert post(server, json.dumps({"customer": "c2", "amount": 700}).encode(), "evt-2") == 200  # replaces evt-2
    assert post(server, b"{not json", "evt-3") == 400
    browser.get(console(server, f"webhooks/{SOURCE}"))
    figure = lambda key: text_of(browser, f'[data-figure="{key}"] dd')  # noqa: E731
    wait_until(browser, lambda d: figure("received") == "5", message="received")
    assert (figure("accepted"), figure("rows_duplicate"), figure("rows_replaced"), figure("rejected")) == ("4", "1", "1", "1")
    assert text_of(browser, '[data-reason="invalid_body"] td:nth-child(2)') == "1"
    assert text_of(browser, "#webhook-url").endswith(f"/api/webhook/headrace/public/{SOURCE}")
    rejected = wait_until(browser, lambda d: texts_of(d, 'tr.request[data-status="400"]'))
    assert "invalid_body" in rejected[0]  # type: ignore[index]
    # The page's own test request: POSTed to the source, counted, listed.
    body = browser.find_element(By.ID, "test-body")
    body.clear()
    body.send_keys('{"customer": "c3", "amount": 99}')
    headers = browser.find_element(By.ID, "test-headers")
    headers.clear()
    headers.send_keys("Content-Type: application/json\nIdempotency-Key: from-the-console")
    browser.find_element(By.ID, "test-send").click()
    wait_until(browser, lambda d: text_of(d, "#test-outcome").startswith("200"), message="test request")
    wait_until(browser, lambda d: figure("received") == "6", message="test request counted")
    assert figure("rate").endswith("req/s")
    screenshots(browser, "webhook-source")


def test_subscribe_is_a_live_table(server: HeadraceProcess, browser: WebDriver,
                                   screenshots: Callable[[WebDriver, str], Path]) -> None:
    results = run_sql_in_editor(browser, server, f"SUBSCRIBE TO {VIEW}")
    rows = lambda: sorted(text.replace("\t", " ") for text in texts_of(browser, 'table[data-live="true"] tr.live-row'))  # noqa: E731
    # The snapshot, once the pipeline has materialized the view: c1 (1 order of 1200), c2 (700), c3 (99).
    wait_until(browser, lambda d: len(rows()) == 3, timeout=300, message=lambda: results.text)
    assert rows() == ["1 c1 1 1200", "1 c2 1 700", "1 c3 1 99"]
    assert post(server, json.dumps({"customer": "c1", "amount": 300}).encode(), "evt-4") == 200
    wait_until(browser, lambda d: "1 c1 2 1500" in rows(), timeout=120, message=lambda: str(rows()))
    assert rows() == ["1 c1 2 1500", "1 c2 1 700", "1 c3 1 99"]
    assert int(browser.find_element(By.CSS_SELECTOR, ".result.live .result-caption").get_attribute("data-updates")) >= 5
    screenshots(browser, "subscribe")
    browser.find_element(By.ID, "sql-cancel").click()
    wait_until(browser, lambda d: text_of(d, "#sql-status") == "cancelled")


def test_a_failing_sink_shows_its_error(server: HeadraceProcess, browser: WebDriver,
                                        screenshots: Callable[[WebDriver, str], Path]) -> None:
    # An HTTP sink into a webhook source that does not exist: every batch is refused with 404, retried with backoff.
    target = server.webhook_url("nowhere")
    results = run_sql_in_editor(browser, server,
        f"CREATE SINK totals_out FROM {VIEW} INTO HTTP (URL '{target}') WITH (DELTA UPDATES = true)")
    wait_until(browser, lambda d: "CREATE SINK" in results.text, message=lambda: results.text)
    browser.get(console(server, "materializations"))
    row = '[data-sink="totals_out"]'
    wait_until(browser, lambda d: "404" in text_of(d, f"{row} [data-error]"), timeout=90,
               message=lambda: text_of(browser, "#sink-materializations"))
    # sink_status says retrying; headrace_internal.materializations, where the server has it, failed (and retried)
    assert text_of(browser, f"{row} [data-state]") in ("retrying", "failed")
    assert "unknown webhook source" in text_of(browser, f"{row} [data-error]")
    source = f'[data-materialization="public.{SOURCE}"]'
    wait_until(browser, lambda d: text_of(d, f"{source} [data-state]") == "running")
    assert browser.find_elements(By.CSS_SELECTOR, f"{source} svg polyline")  # the freshness chart has samples
    screenshots(browser, "materializations")


def test_objects_with_their_sql_and_dependencies(server: HeadraceProcess, browser: WebDriver,
                                                  screenshots: Callable[[WebDriver, str], Path]) -> None:
    browser.get(console(server, "objects"))
    names = lambda: texts_of(browser, "a.object-link")  # noqa: E731
    wait_until(browser, lambda d: {SOURCE, VIEW, "totals_out"} <= set(names()), message=lambda: str(names()))
    sinks = text_of(browser, '[data-kind="sink"]')
    assert "totals_out" in sinks and VIEW in sinks  # the sink reads the view
    browser.execute_script("document.querySelector(arguments[0]).click()", f'a.object-link[data-object="{VIEW}"]')
    detail = browser.find_element(By.ID, "object-detail")
    wait_until(browser, lambda d: "CREATE MATERIALIZED VIEW" in detail.text, message=lambda: detail.text)
    assert "customer" in detail.text and "totals_out" in detail.text  # its columns; read by the sink
    screenshots(browser, "objects")
    webhooks = console(server, "webhooks")
    browser.get(webhooks)
    wait_until(browser, lambda d: SOURCE in text_of(d, "main table"))
    screenshots(browser, "webhooks")


def test_a_role_with_a_password_signs_in(server: HeadraceProcess, browser: WebDriver,
                                         screenshots: Callable[[WebDriver, str], Path]) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE ROLE watcher LOGIN PASSWORD 'watch-it'")
    browser.get(console(server, "webhooks"))
    browser.execute_script("sessionStorage.setItem('headrace.console.credentials', JSON.stringify({user: 'watcher'}))")
    browser.refresh()
    wait_until(browser, lambda d: d.find_elements(By.ID, "signin-password"), message=lambda: text_of(browser, "main"))
    assert "28P01" in text_of(browser, "main") and 'password authentication failed for user "watcher"' in text_of(browser, "main")
    screenshots(browser, "sign-in")
    for password, expected in (("wrong", "28P01"), ("watch-it", None)):
        field = browser.find_element(By.ID, "signin-password")
        field.clear()
        field.send_keys(password)
        browser.execute_script("document.querySelector('form.signin').dataset.tried = 'yes'")
        browser.find_element(By.CSS_SELECTOR, "form.signin button").click()
        if expected:  # the form again (a new one), with the error
            wait_until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "form.signin:not([data-tried])")
                       and expected in text_of(d, "main"), message=lambda: text_of(browser, "main"))
    # Signed in: the page reads the system relations as watcher (readable by every role).
    wait_until(browser, lambda d: SOURCE in text_of(d, "main table"), message=lambda: text_of(browser, "main"))
    assert text_of(browser, "#who") == "as watcher"
