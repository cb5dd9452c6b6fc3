"""The web console (/console) in a real headless Chromium (Debian's, through chromium-driver): sign in with a key,
a trained run's curves hold exactly the REST history's points, a checkpoint published from the page is published,
another user sees none of it, and a step trained while the page is open appears on it (the delay is printed).
Screenshots at laptop and phone widths go to test-artifacts/console/."""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import tinker
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.integration.helpers import raw_client, sft_datums

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "console"
OWNER, OTHER = "tml-console-owner", "tml-console-someone-else"
LAPTOP, PHONE = (1366, 768), (390, 844)
LOSS = "loss:sum"


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.fail("Chromium and its driver are missing: `make browser` (apt-get install chromium chromium-driver)")
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never download a browser or driver
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--hide-scrollbars"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_script_timeout(30)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def owner_client(base_url: str) -> Iterator[tinker.ServiceClient]:
    """A user of the console's own, so its pages (and screenshots) show only this module's runs."""
    client = tinker.ServiceClient(base_url=base_url, api_key=OWNER)
    yield client
    client.close("success").result()


def viewport(driver: WebDriver, size: tuple[int, int]) -> None:
    width, height = size
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600},
    )


def screenshot(driver: WebDriver, name: str, full_page: bool = False) -> None:
    """The viewport (or the whole page) as test-artifacts/console/{name}.png, without a passing notice."""
    driver.execute_script("document.getElementById('toast').hidden = true")
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": full_page})
    (ARTIFACTS / f"{name}.png").write_bytes(base64.b64decode(shot["data"]))


def wait_for(check: Callable[[], Any], what: str, timeout_s: float = 30, every_s: float = 0.05) -> Any:
    """`check()`'s first truthy answer; an element the page re-rendered between its finding and its reading (stale)
    counts as not yet."""
    deadline = time.monotonic() + timeout_s
    while not (found := _stale_as_none(check)):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every_s)
    return found


def _stale_as_none(check: Callable[[], Any]) -> Any:
    try:
        return check()
    except StaleElementReferenceException:  # the page replaced the element (a table re-rendered as it refreshed)
        return None


def sign_in(driver: WebDriver, base_url: str, key: str, hash_route: str = "") -> None:
    driver.get(f"{base_url}/console")
    driver.execute_script("sessionStorage.clear()")
    driver.get(f"{base_url}/console")
    wait_for(lambda: driver.find_elements(By.ID, "api-key"), "the sign-in form")
    driver.find_element(By.ID, "api-key").send_keys(key)
    driver.find_element(By.ID, "sign-in").click()
    wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "#server .model"), "the overview")
    if hash_route:
        driver.execute_script("location.hash = arguments[0]", hash_route)


def plotted(driver: WebDriver, metric: str) -> dict[str, list[tuple[int, float]]]:
    """What the page's chart of `metric` draws: (step, value) points by operation kind."""
    found = driver.execute_script(
        "const c = window.tinkerConsole.charts[arguments[0]];"
        "return c ? {data: c.data, kinds: window.tinkerConsole.kinds[arguments[0]]} : null",
        metric,
    )
    if found is None:
        return {}
    xs, columns = found["data"][0], found["data"][1:]
    return {
        kind: [(x, y) for x, y in zip(xs, column, strict=True) if y is not None]
        for kind, column in zip(found["kinds"], columns, strict=True)
    }


def expected(points: list[dict], metric: str) -> dict[str, list[tuple[int, float]]]:
    by_kind: dict[str, list[tuple[int, float]]] = {}
    for p in points:
        value = p["learning_rate"] if metric == "learning_rate" else p["metrics"].get(metric)
        if value is not None:
            by_kind.setdefault(p["kind"], []).append((p["step"], value))
    return by_kind


def history(base_url: str, run_id: str) -> list[dict]:
    points: list[dict] = []
    with raw_client(base_url, OWNER) as http:
        after = -1
        while after is not None:
            page = http.get(f"/api/v1/training_runs/{run_id}/history", params={"after_seq": after}).json()
            points += page["points"]
            after = page["next_after_seq"]
    return points


def test_the_console_shows_a_users_runs_live_and_publishes_checkpoints(
    browser: WebDriver, owner_client: tinker.ServiceClient, base_url: str
) -> None:
    tc = owner_client.create_lora_training_client(base_model="tinker-serve/tiny", rank=8, seed=71).result()
    data = sft_datums(tc.get_tokenizer())
    for step in range(8):
        tc.forward_backward(data, "cross_entropy").result()
        tc.optim_step(tinker.types.AdamParams(learning_rate=1e-2 * 0.8**step)).result()
        if step % 2 == 1:
            tc.forward(data[:2], "cross_entropy").result()  # an "eval" series beside the training loss
    state = tc.save_state("step-8").result().path
    tc.save_weights_for_sampler("sampler-step-8", ttl_seconds=7 * 86400).result()
    run_id, run_route = tc.model_id, f"#/runs/{quote(tc.model_id)}"

    # the overview: the user's run and session, and the server's samplers (replicas read from Serve)
    viewport(browser, LAPTOP)
    sign_in(browser, base_url, OWNER)
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#sessions-table a"), "the sessions table")
    assert run_id in browser.find_element(By.ID, "runs").get_attribute("innerHTML")
    with raw_client(base_url, OWNER) as http:
        status = http.get("/api/v1/server_status").json()
    assert status["base_models"][0]["sampler"]["replicas"] == {"RUNNING": 1}
    assert "1 running" in browser.find_element(By.ID, "server").text
    screenshot(browser, "laptop-overview")

    # the run page: every plotted point is a REST history point, and every history point is plotted
    browser.execute_script("location.hash = arguments[0]", run_route)
    points = history(base_url, run_id)
    for metric in (LOSS, "learning_rate"):
        want = expected(points, metric)
        wait_for(lambda m=metric, w=want: plotted(browser, m) == w, f"the {metric} chart to match the history")
    assert set(expected(points, LOSS)) == {"forward_backward", "forward"}
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#checkpoints-table tr[data-checkpoint]"), "checkpoints")
    time.sleep(0.3)  # let the charts settle their size
    screenshot(browser, "laptop-run")

    # publish from the page; REST agrees
    row = 'tr[data-checkpoint="weights/step-8"]'
    assert browser.find_element(By.CSS_SELECTOR, row).get_attribute("data-public") == "false"
    browser.find_element(By.CSS_SELECTOR, f'{row} button[data-action="publish"]').click()
    wait_for(
        lambda: browser.find_elements(By.CSS_SELECTOR, f'{row}[data-public="true"]'), "the row to show it published"
    )
    with raw_client(base_url, OWNER) as http:
        listed = http.get(f"/api/v1/training_runs/{run_id}/checkpoints").json()["checkpoints"]
    assert {c["tinker_path"]: c["public"] for c in listed}[state] is True
    browser.execute_script("document.getElementById('checkpoints').scrollIntoView()")
    time.sleep(0.3)
    screenshot(browser, "laptop-checkpoints")

    # a new TTL through the page's dialog: 2 days
    sampler_row = 'tr[data-checkpoint="sampler_weights/sampler-step-8"]'
    browser.find_element(By.CSS_SELECTOR, f'{sampler_row} button[data-action="ttl"]').click()
    wait_for(lambda: browser.execute_script("return document.getElementById('ttl-dialog').open"), "the TTL dialog")
    amount = browser.find_element(By.ID, "ttl-amount")
    amount.clear()
    amount.send_keys("2")
    screenshot(browser, "laptop-ttl-dialog")
    asked = time.time()
    browser.find_element(By.CSS_SELECTOR, '#ttl-form button[value="set"]').click()
    wait_for(lambda: "in 2 days" in browser.find_element(By.CSS_SELECTOR, sampler_row).text, "the new expiry")
    with raw_client(base_url, OWNER) as http:
        listed = http.get(f"/api/v1/training_runs/{run_id}/checkpoints").json()["checkpoints"]
    expires = {c["checkpoint_id"]: c.get("expires_at") for c in listed}["sampler_weights/sampler-step-8"]
    assert abs(datetime.fromisoformat(expires).timestamp() - (asked + 2 * 86400)) < 60

    # a phone: the run page and the overview fit 390 px
    viewport(browser, PHONE)
    browser.execute_script("window.scrollTo(0, 0); window.dispatchEvent(new Event('resize'))")
    time.sleep(0.5)
    assert browser.execute_script("return document.documentElement.scrollWidth") <= PHONE[0]
    screenshot(browser, "phone-run", full_page=True)
    browser.execute_script("location.hash = '#/'")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#sessions-table a"), "the overview on a phone")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#server .model"), "the server panel on a phone")
    assert browser.execute_script("return document.documentElement.scrollWidth") <= PHONE[0]
    screenshot(browser, "phone-overview", full_page=True)

    # another user: none of it
    viewport(browser, LAPTOP)
    browser.find_element(By.ID, "sign-out").click()
    sign_in(browser, base_url, OTHER)
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#runs .empty"), "the other user's empty runs list")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#sessions .empty"), "the other user's empty sessions")
    assert run_id not in browser.page_source
    browser.execute_script("location.hash = arguments[0]", run_route)
    error = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, ".error-text"), "the other user's error")
    assert "does not exist" in error[0].text
    assert browser.execute_script("return window.tinkerConsole.points.length") == 0

    # live: one more step while the owner's page is open
    browser.find_element(By.ID, "sign-out").click()
    sign_in(browser, base_url, OWNER, run_route)
    wait_for(lambda: plotted(browser, LOSS) == expected(points, LOSS), "the run page again")
    tc.forward_backward(data, "cross_entropy").result()
    tc.optim_step(tinker.types.AdamParams(learning_rate=1e-3)).result()
    finished = time.time()
    seq = history(base_url, run_id)[-1]["seq_id"]  # the optim_step's
    drawn = wait_for(
        lambda: browser.execute_script(
            "const t = window.tinkerConsole; return t.drawnSeq >= arguments[0] ? t.drawnAt : null", seq
        ),
        "the new step on the page",
        every_s=0.01,
    )
    point_time = history(base_url, run_id)[-1]["time"]
    print(
        f"\nconsole live update: step finished (SDK) -> on the page in {drawn / 1000 - finished:.2f} s "
        f"({drawn / 1000 - point_time:.2f} s after the trainer recorded it); poll interval "
        f"{browser.execute_script('return window.tinkerConsole.pollMs')} ms"
    )
    assert drawn / 1000 - point_time < 10
    final = history(base_url, run_id)
    assert plotted(browser, LOSS) == expected(final, LOSS)
    assert plotted(browser, "learning_rate") == expected(final, "learning_rate")
    (ARTIFACTS / "history.json").write_text(json.dumps(final))
