"""The chat page (python/tinyloop/server/static/index.html) in a real headless browser:
Debian's chromium driven by selenium through Debian's chromedriver, against `tinyloop serve`
on the bundled model. The page loads, a message gets an answer that streams in (its text
grows in several steps over time, recorded inside the page as it changes), the figures under
it (tokens, tokens/s, loops per token) agree with each other, and Stop ends a running answer.

A screenshot goes to the test's tmp dir; with TINYLOOP_UPDATE_SCREENSHOT=1 also to
docs/images/chat-page.png (committed; the README and docs/server.md show it).
TINYLOOP_TEST_SERVER=http://127.0.0.1:PORT runs the test against a server already running.
Skips only when chromium, chromedriver or selenium is missing (scripts/setup.sh installs them).
"""
import os
import shutil
import sys
import time

import pytest

_REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(_REPO, "bench"))

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    pytest.skip("chromium / chromedriver missing (apt-get install chromium chromium-driver; "
                "scripts/setup.sh installs them)", allow_module_level=True)
selenium = pytest.importorskip("selenium", reason="selenium missing (requirements-dev.txt)")

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

import server_load  # noqa: E402  (bench/server_load.py: the server subprocess helper)

# Records every text the newest answer shows, with its time, from inside the page (a poll
# from the test would miss steps: the bundled model writes ~200 tokens/s). Optionally clicks
# Stop as soon as the first text appears.
WATCH_JS = """
window.__growth = [];
const stopEarly = arguments[0];
const seen = new Set(document.querySelectorAll('.msg.assistant'));
new MutationObserver((records, obs) => {
  const answers = [...document.querySelectorAll('.msg.assistant')].filter(a => !seen.has(a));
  if (!answers.length) return;
  const content = answers[answers.length - 1].querySelector('.content');
  for (const r of records) {
    if (r.target === content || content.contains(r.target)) {
      window.__growth.push([performance.now(), content.textContent.length]);
    }
  }
  if (stopEarly && content.textContent.length > 0 && !window.__stopped) {
    window.__stopped = true;
    document.getElementById('stop').click();
  }
}).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});
"""


@pytest.fixture(scope="module")
def server():
    url = os.environ.get("TINYLOOP_TEST_SERVER")
    if url:
        yield url.rstrip("/")
        return
    srv = server_load.start_tinyloop(server_load.BUNDLED_MODEL, timeout=60)
    try:
        yield srv.base_url
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,860"):
        opts.add_argument(arg)
    # An explicit driver path: selenium's Selenium Manager (which would try to download a
    # driver and a browser) is skipped; nothing is fetched.
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _set(driver, elem_id, value):
    el = driver.find_element(By.ID, elem_id)
    el.clear()
    el.send_keys(str(value))


def _ask(driver, text, stop_early=False, timeout=30):
    """Send `text`, wait until the answer stops streaming; (answer element, growth record)."""
    driver.execute_script(WATCH_JS, stop_early)
    n_before = len(driver.find_elements(By.CSS_SELECTOR, ".msg.assistant"))
    _set(driver, "prompt", text)
    driver.find_element(By.ID, "send").click()
    wait = WebDriverWait(driver, timeout)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant")) > n_before)
    answer = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1]
    wait.until(lambda d: answer.get_attribute("data-state") != "streaming")
    return answer, driver.execute_script("return window.__growth")


def _figure(answer, css):
    els = answer.find_elements(By.CSS_SELECTOR, css)
    return els[0].text if els else None


def test_chat_page_streams_an_answer(server, browser, tmp_path):
    t0 = time.perf_counter()
    browser.get(server + "/")
    assert browser.title == "TinyLoop chat"
    # The page asked /v1/models for the model's name.
    WebDriverWait(browser, 15).until(
        lambda d: d.find_element(By.ID, "model").text not in ("", "…"))
    assert browser.find_element(By.ID, "status").text == "ready"
    _set(browser, "max_tokens", 48)
    _set(browser, "temperature", 0)

    answer, growth = _ask(browser, "Once upon a time")
    state = answer.get_attribute("data-state")
    text = answer.find_element(By.CSS_SELECTOR, ".content").text
    assert state == "done", f"answer ended {state!r}: {text!r}"
    assert text.strip(), "the answer is empty"
    # Streamed: the text grew in several steps, over time, not in one piece at the end.
    lengths = [n for _, n in growth if n > 0]
    assert len(set(lengths)) >= 3, f"text appeared in {len(set(lengths))} step(s): {growth}"
    assert lengths == sorted(lengths), f"the text shrank while streaming: {growth}"
    first = next(t for t, n in growth if n > 0)
    assert growth[-1][0] > first, f"every step at the same instant: {growth}"

    tokens = int(_figure(answer, ".stats .tokens b"))
    assert 1 <= tokens <= 48
    tps = float(_figure(answer, ".stats .tps b"))
    assert tps > 0
    mean_loops = float(_figure(answer, ".stats .loops b"))
    assert 1 <= mean_loops <= 64
    # One bar per token: the per-token depths arrived with the chunks (early exit is off).
    bars = answer.find_elements(By.CSS_SELECTOR, ".loopbars span")
    assert len(bars) == tokens, f"{len(bars)} loop bars for {tokens} tokens"

    # A second turn keeps the conversation (the first exchange stays on the page), with early
    # exit on: the depths then come only with the last chunk, one per token, none deeper
    # than the model's default.
    browser.find_element(By.ID, "ee_on").click()
    answer2, _ = _ask(browser, "And then?")
    assert answer2.get_attribute("data-state") == "done"
    assert len(browser.find_elements(By.CSS_SELECTOR, ".msg.user")) == 2
    tokens2 = int(_figure(answer2, ".stats .tokens b"))
    bars2 = answer2.find_elements(By.CSS_SELECTOR, ".loopbars span")
    assert len(bars2) == tokens2, f"{len(bars2)} loop bars for {tokens2} tokens"
    assert float(_figure(answer2, ".stats .loops b")) <= mean_loops

    shot = tmp_path / "chat-page.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    if os.environ.get("TINYLOOP_UPDATE_SCREENSHOT") == "1":
        os.makedirs(os.path.join(_REPO, "docs", "images"), exist_ok=True)
        shutil.copy(shot, os.path.join(_REPO, "docs", "images", "chat-page.png"))
    assert time.perf_counter() - t0 < 60


def test_stop_ends_a_running_answer(server, browser):
    browser.get(server + "/")
    WebDriverWait(browser, 15).until(lambda d: d.find_element(By.ID, "status").text == "ready")
    _set(browser, "max_tokens", 200)
    _set(browser, "temperature", 0.8)
    answer, growth = _ask(browser, "Tell me a long story.", stop_early=True)
    assert answer.get_attribute("data-state") == "stopped", _figure(answer, ".stats")
    assert _figure(answer, ".stats .finish") == "stopped"
    # The page is ready for the next message.
    assert browser.find_element(By.ID, "send").is_displayed()
    assert not browser.find_element(By.ID, "stop").is_displayed()
    # New chat forgets the conversation.
    browser.find_element(By.ID, "new-chat").click()
    assert not browser.find_elements(By.CSS_SELECTOR, ".msg")


def test_a_refused_request_shows_the_servers_error(server, browser):
    browser.get(server + "/")
    WebDriverWait(browser, 15).until(lambda d: d.find_element(By.ID, "status").text == "ready")
    _set(browser, "max_tokens", 0)  # the server answers 400 naming max_tokens
    answer, _ = _ask(browser, "Hello")
    assert answer.get_attribute("data-state") == "error"
    text = answer.find_element(By.CSS_SELECTOR, ".content").text
    assert text.startswith("400") and "max_tokens" in text, text
