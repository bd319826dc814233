"""End to end: the web console (`/ui`) in Debian's chromium, headless, driven by
Selenium against a real `sandlot serve` with a tenant's token: sign in, create a
sandbox with a network allow-list and a tag holding markup, type `echo hi` into the
terminal and read it back, upload a file whose name is markup and see it listed,
make the sandbox try a connection its policy denies (to a TEST-NET address; the
proxy refuses it, nothing leaves the host) and see it in the egress log, delete the
sandbox; then create and delete a volume and a secret (whose value must not stay in
the page). Then the operator's page, signed in with an operator token made on the
socket: the tenants with their usage, a tenant token created (its secret shown
once, its markup name as text) and revoked after a confirmation; a tenant's token
has no such page. Then two snapshots, one started from the other, shown as a tree on
the images page and compared with its diff (a path holding markup stays text).
Tenant strings must show as text: no element is made from them and no
script of theirs runs. Screenshots of the pages at two window sizes, light and
dark, go to tests/console/screenshots/ (or $SANDLOT_CONSOLE_SCREENSHOTS).
Needs root (the daemon creates sandboxes), chromium and chromium-driver.
Run: bash tests/console/run.sh   (SANDLOT_BIN picks the binary; default
$CARGO_TARGET_DIR/debug/sandlot, else target/debug/sandlot;
SANDLOT_TEST_ISOLATION the sandbox's isolation).
"""
import base64
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.expected_conditions import staleness_of
from selenium.webdriver.support.ui import Select, WebDriverWait

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sandlot_daemon import Daemon, daemon_fixture, require_root_and_binary  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
MARKUP_TAG = "<img src=x onerror=window.__xss=1>"
MARKUP_FILE = "<img src=x onerror=window.__xss=2>.txt"
SIZES = {"wide": (1280, 900), "narrow": (420, 860)}


def screenshot_dir() -> Path:
    d = Path(os.environ.get("SANDLOT_CONSOLE_SCREENSHOTS") or Path(__file__).parent / "screenshots")
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def daemon():
    why = require_root_and_binary("the console's browser test")
    if why:
        pytest.fail(why)
    yield from daemon_fixture(lambda tmp: Daemon(tmp, "uit"), "console")


@pytest.fixture(scope="module")
def browser():
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            pytest.fail(f"{path} is missing: run scripts/setup.d/80-console.sh (Debian's chromium and chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--disable-extensions", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-default-apps"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_window_size(*SIZES["wide"])
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver, what, cond, timeout=20):
    """Until `cond` answers something true. The console re-renders its live tables,
    so an element found a moment ago may be gone: that try is simply repeated."""
    return WebDriverWait(driver, timeout, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: cond(d), message=what)


def click(driver, what, css, timeout=20, by=By.CSS_SELECTOR):
    def go(d):
        d.find_element(by, css).click()
        return True
    wait(driver, what, go, timeout)


def action(label: str) -> str:
    """The XPath of the sandbox page's action button `label`."""
    return f"//main//span[@class='actions']/button[normalize-space()='{label}']"


def shoot(driver, name: str):
    """The current page at both window sizes, light and dark."""
    out = screenshot_dir()
    for scheme in ("light", "dark"):
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia",
                               {"features": [{"name": "prefers-color-scheme", "value": scheme}]})
        for size, (w, h) in SIZES.items():
            driver.set_window_size(w, h)
            time.sleep(0.2)  # a frame for the layout to settle before the picture
            shot = driver.execute_cdp_cmd("Page.captureScreenshot",
                                          {"format": "png", "captureBeyondViewport": True})
            (out / f"{name}-{size}-{scheme}.png").write_bytes(base64.b64decode(shot["data"]))
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
    driver.set_window_size(*SIZES["wide"])


def terminal_rows(driver) -> list[str]:
    return driver.execute_script(
        "return [...document.querySelectorAll('#terminal .xterm-rows > div')].map(d => d.textContent)")


def type_into_terminal(driver, text: str):
    driver.find_element(By.CSS_SELECTOR, "#terminal .xterm-helper-textarea").send_keys(text)


def no_markup_ran(driver):
    assert driver.execute_script("return window.__xss") is None, "tenant markup ran as script"
    assert driver.find_elements(By.CSS_SELECTOR, "main img") == [], "tenant markup became an element"


def test_console_drives_a_sandbox_its_terminal_files_and_egress_log_then_volumes_and_secrets(daemon, browser):
    d = browser
    base = f"http://127.0.0.1:{daemon.api_port}"
    token = daemon.token("acme")

    d.get(f"{base}/ui")
    assert d.current_url == f"{base}/ui/"
    field = wait(d, "the sign-in form", lambda d: d.find_element(By.NAME, "token"))
    shoot(d, "signin")
    field.send_keys("sl_not_a_token")
    d.find_element(By.CSS_SELECTOR, "form.signin button[type=submit]").click()
    wait(d, "a refused token is said so", lambda d: "not valid" in d.find_element(By.CSS_SELECTOR, "form.signin .error").text)
    field.clear()
    field.send_keys(token)
    d.find_element(By.CSS_SELECTOR, "form.signin button[type=submit]").click()
    wait(d, "the tenant in the header", lambda d: "tenant acme" in d.find_element(By.ID, "who").text)
    # The token lives in sessionStorage only.
    assert d.execute_script("return sessionStorage.getItem('sandlot.token')") == token
    assert d.execute_script("return localStorage.length") == 0
    assert d.get_cookies() == []

    # Create: an allow-list policy and a tag holding markup.
    form = d.find_element(By.ID, "create-form")
    isolation = os.environ.get("SANDLOT_TEST_ISOLATION")
    if isolation:
        Select(form.find_element(By.NAME, "isolation")).select_by_value(isolation)
    form.find_element(By.NAME, "memory").send_keys("256M")
    form.find_element(By.NAME, "timeout").send_keys("5m")
    form.find_element(By.NAME, "tags").send_keys(f"note={MARKUP_TAG}")
    Select(form.find_element(By.NAME, "network")).select_by_value("allow")
    form.find_element(By.NAME, "allow").send_keys("allowed.test:443")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    sid, tag_texts = wait(d, "the new sandbox running in the list", lambda d: next(
        ((r.get_attribute("data-id"), [t.text for t in r.find_elements(By.CSS_SELECTOR, ".tag")])
         for r in d.find_elements(By.CSS_SELECTOR, "#sandbox-list tr[data-id]")
         if "running" in r.text), None), timeout=60)
    assert sid.startswith(daemon.prefix)
    assert f"note={MARKUP_TAG}" in tag_texts
    no_markup_ran(d)
    # The filter hides what does not match and keeps what does.
    filt = d.find_element(By.CSS_SELECTOR, "#main input[type=search]")
    filt.send_keys("no-such-sandbox")
    wait(d, "the filter hides the sandbox", lambda d: not d.find_elements(By.CSS_SELECTOR, f"tr[data-id='{sid}']"))
    filt.clear()
    filt.send_keys(sid[-6:])
    wait(d, "the filter keeps the sandbox", lambda d: d.find_elements(By.CSS_SELECTOR, f"tr[data-id='{sid}']"))
    shoot(d, "sandboxes")
    # The list re-renders every 2 s; a keyboard user's focus stays on the same control.
    # Found and focused in one script: a re-render between a lookup and a focus
    # sent apart would leave the looked-up button stale.
    old = d.execute_script(
        "const b = document.evaluate(arguments[0], document, null,"
        " XPathResult.FIRST_ORDERED_NODE_TYPE, null).singleNodeValue; b.focus(); return b",
        f"//tr[@data-id='{sid}']//button[normalize-space()='Pause']")
    WebDriverWait(d, 20).until(staleness_of(old), message="the list re-rendered")
    focused = d.execute_script(
        "const a = document.activeElement; return [a.closest('tr') && a.closest('tr').dataset.id, a.textContent]")
    assert focused == [sid, "Pause"]

    # One sandbox: its terminal.
    click(d, "the sandbox's link", f"tr[data-id='{sid}'] a")
    click(d, "the open-terminal button", "#open-terminal")
    wait(d, "the terminal", lambda d: d.find_elements(By.CSS_SELECTOR, "#terminal .xterm-rows > div"))
    wait(d, "a shell prompt", lambda d: any(r.strip() for r in terminal_rows(d)), timeout=30)
    type_into_terminal(d, "echo hi\n")
    wait(d, "`hi` read back from the terminal", lambda d: "hi" in [r.strip() for r in terminal_rows(d)], timeout=30)
    # Its CPU and memory over time: a line each, from the metrics history.
    wait(d, "the usage charts", lambda d: len(d.find_elements(By.CSS_SELECTOR, "#usage svg polyline")) == 2)
    caption = wait(d, "the memory chart's caption", lambda d: d.find_element(By.CSS_SELECTOR, "#usage-memory figcaption").text)
    assert caption.startswith("Memory: now ") and "B" in caption, caption
    # Process output that is markup is drawn as characters.
    type_into_terminal(d, "echo '<img src=x onerror=window.__xss=4>' | tr x y\n")
    wait(d, "the markup output", lambda d: "<img src=y onerror=window.__yss=4>" in [r.strip() for r in terminal_rows(d)])
    no_markup_ran(d)

    # Its processes: one started through the API, its output read again from the
    # start in the console (markup stays text), then killed from the console.
    proc = daemon.native("POST", f"/v1/sandboxes/{sid}/exec", token, {
        "argv": ["sh", "-c", "echo '<img src=x onerror=window.__pss=5>' | tr x y; echo to-stderr >&2; exec sleep 300"],
        "tag": "console-proc", "background": True,
    })
    row = f"#processes tr[data-process='{proc['id']}']"
    wait(d, "the process listed", lambda d: "console-proc" in d.find_element(By.CSS_SELECTOR, row).text)
    click(d, "the process's output button", f"{row} button")
    out = wait(d, "the process's output", lambda d: (lambda t: t if "to-stderr" in t else None)(
        d.find_element(By.CSS_SELECTOR, "#process-output pre.output").text))
    assert "<img src=y onerror=window.__pss=5>" in out, out
    no_markup_ran(d)
    assert d.execute_script("return window.__pss") is None, "process output ran as script"
    click(d, "the process's kill button", f"{row} button.danger")
    wait(d, "the process killed", lambda d: "killed (signal 9)" in d.find_element(By.CSS_SELECTOR, row).text)
    wait(d, "its output ended", lambda d: "Ended: killed (signal 9)." in d.find_element(By.ID, "process-output").text)

    # Files: upload one whose name is markup, see it listed as text.
    tmp = Path(tempfile.mkdtemp(prefix="sandlot-console-upload-"))
    try:
        local = tmp / MARKUP_FILE
        local.write_text("uploaded from the console\n")
        d.find_element(By.NAME, "upload").send_keys(str(local))
        d.find_element(By.ID, "upload-button").click()
        listed = wait(d, "the uploaded file listed", lambda d: next(
            (r.find_element(By.CSS_SELECTOR, ".file-name").text
             for r in d.find_elements(By.CSS_SELECTOR, "#file-list tr[data-path]")
             if r.get_attribute("data-path") == f"/tmp/{MARKUP_FILE}"), None))
        assert listed == MARKUP_FILE
        no_markup_ran(d)
        # Download it back: the bytes arrive as a file, not as a page.
        saved = tmp / "downloads"
        saved.mkdir()
        d.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(saved)})
        click(d, "the download button", f"#file-list tr[data-path='/tmp/{MARKUP_FILE}'] button")
        got = wait(d, "the downloaded file", lambda d: [
            p.read_text() for p in saved.iterdir() if not p.name.endswith(".crdownload")])
        assert got == ["uploaded from the console\n"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    # A connection the policy denies: an HTTP request for a name not on the
    # allow-list, dialled at a TEST-NET-1 address. The daemon's proxy reads the
    # Host, refuses and resets; nothing leaves the host.
    type_into_terminal(
        d, "printf 'GET / HTTP/1.0\\r\\nHost: denied.test\\r\\n\\r\\n' >/dev/tcp/192.0.2.1/80; echo tried-$?\n")
    wait(d, "the attempt made", lambda d: any(r.strip().startswith("tried-") for r in terminal_rows(d)), timeout=30)
    # And one whose Host is markup: whatever the log records of it stays text.
    type_into_terminal(
        d, "printf 'GET / HTTP/1.0\\r\\nHost: %s\\r\\n\\r\\n' '<img src=x onerror=window.__xss=3>' "
           ">/dev/tcp/192.0.2.1/80; echo again-$?\n")
    wait(d, "the second attempt made", lambda d: any(r.strip().startswith("again-") for r in terminal_rows(d)), timeout=30)
    denied = wait(d, "the denied attempt in the egress log", lambda d: next(
        (r.text for r in d.find_elements(By.CSS_SELECTOR, "#egress-log tr.decision-denied")
         if "denied.test" in r.text or "192.0.2.1" in r.text), None), timeout=30)
    assert "denied" in denied
    wait(d, "both attempts in the egress log", lambda d: len(
        d.find_elements(By.CSS_SELECTOR, "#egress-log tr.decision-denied")) >= 2, timeout=30)
    assert "<img src=x onerror=window.__xss=3>" in d.find_element(By.ID, "egress-log").text
    no_markup_ran(d)
    Select(d.find_element(By.CSS_SELECTOR, "#main select[aria-label=Decision]")).select_by_value("allowed")
    wait(d, "the decision filter hides the denied entry",
         lambda d: not d.find_elements(By.CSS_SELECTOR, "#egress-log tr.decision-denied"))
    Select(d.find_element(By.CSS_SELECTOR, "#main select[aria-label=Decision]")).select_by_value("")
    shoot(d, "sandbox")

    # Pause and resume from its page.
    click(d, "the pause button", action("Pause"), by=By.XPATH)
    wait(d, "the sandbox paused", lambda d: d.find_element(By.CSS_SELECTOR, "#main .bar .state").text == "paused", timeout=60)
    click(d, "the resume button", action("Resume"), by=By.XPATH, timeout=60)
    wait(d, "the sandbox running again", lambda d: d.find_element(By.CSS_SELECTOR, "#main .bar .state").text == "running", timeout=60)
    # The pause ended the terminal's shell: it reconnects to a new one.
    click(d, "the reconnect button", "#open-terminal")
    wait(d, "a new shell's prompt", lambda d: "[disconnected]" not in " ".join(terminal_rows(d))
         and any(r.strip() for r in terminal_rows(d)), timeout=30)
    type_into_terminal(d, "echo again-$((40+2))\n")
    wait(d, "the new shell answers", lambda d: "again-42" in [r.strip() for r in terminal_rows(d)], timeout=30)

    # Delete (asks first): cancelling keeps it, accepting deletes it.
    click(d, "the link back", "#main a[href='#/']")
    click(d, "the delete button", f"tr[data-id='{sid}'] button.danger")
    d.switch_to.alert.dismiss()
    assert d.find_elements(By.CSS_SELECTOR, f"tr[data-id='{sid}']")
    click(d, "the delete button", f"tr[data-id='{sid}'] button.danger")
    d.switch_to.alert.accept()
    wait(d, "the sandbox gone from the live list",
         lambda d: not d.find_elements(By.CSS_SELECTOR, f"tr[data-id='{sid}']"), timeout=30)
    assert daemon.operator("ls", "--quiet").split() == []

    # Images, volumes, secrets (names only).
    click(d, "the images link", "#nav a[href='#/images']")
    wait(d, "the images page", lambda d: d.find_element(By.ID, "images-list").text)
    shoot(d, "images")
    click(d, "the volumes link", "#nav a[href='#/volumes']")
    form = wait(d, "the volume form", lambda d: d.find_element(By.ID, "volume-form"))
    form.find_element(By.NAME, "name").send_keys("scratch")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(d, "the volume listed", lambda d: d.find_elements(By.CSS_SELECTOR, "#volumes-list tr[data-id='scratch']"))
    click(d, "the volume's delete button", "#volumes-list tr[data-id='scratch'] button.danger")
    d.switch_to.alert.accept()
    wait(d, "the volume gone", lambda d: not d.find_elements(By.CSS_SELECTOR, "#volumes-list tr[data-id='scratch']"))
    click(d, "the secrets link", "#nav a[href='#/secrets']")
    form = wait(d, "the secret form", lambda d: d.find_element(By.ID, "secret-form"))
    value = "s3cret-value-typed-once"
    form.find_element(By.NAME, "name").send_keys("api-key")
    form.find_element(By.NAME, "value").send_keys(value)
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(d, "the secret listed", lambda d: d.find_elements(By.CSS_SELECTOR, "#secrets-list tr[data-id='api-key']"))
    assert d.find_element(By.CSS_SELECTOR, "#secret-form input[name=value]").get_attribute("value") == ""
    assert value not in d.page_source
    shoot(d, "secrets")
    click(d, "the secret's delete button", "#secrets-list tr[data-id='api-key'] button.danger")
    d.switch_to.alert.accept()
    wait(d, "the secret gone", lambda d: not d.find_elements(By.CSS_SELECTOR, "#secrets-list tr[data-id='api-key']"))

    # A collection browsed with the virtual shell, and a memory store searched and
    # read with its history; markup in a document stays text.
    docs = Path(tempfile.mkdtemp(prefix="sandlot-console-docs-"))
    try:
        (docs / "guide.md").write_text("# Guide\nThe rate limit is 40 requests a minute. <img src=x onerror=window.__xss=5>\n")
        daemon.operator("vfs", "create", "kb", "--from", str(docs), "--tenant", "acme")
    finally:
        shutil.rmtree(docs, ignore_errors=True)
    daemon.native("POST", "/v1/memory", token, {"name": "notes"})
    daemon.native("POST", "/v1/memory/notes/memories", token,
                  {"title": "Deploy window", "body": "Deploys happen on Tuesdays.", "tags": ["ops"]})
    click(d, "the collections link", "#nav a[href='#/collections']")
    wait(d, "the collection listed", lambda d: d.find_elements(By.XPATH, "//div[@id='collections-list']//td[.='kb']"))
    Select(d.find_element(By.CSS_SELECTOR, "#collections-list select")).select_by_value("kb")
    command = wait(d, "the shell's command field", lambda d: d.find_element(By.CSS_SELECTOR, "#vfs-shell input[name=command]"))
    command.send_keys("grep -r 'rate limit' /\n")
    wait(d, "the grep's output", lambda d: "40 requests" in d.find_element(By.ID, "vfs-output").text)
    assert "<img src=x onerror=window.__xss=5>" in d.find_element(By.ID, "vfs-output").text
    no_markup_ran(d)
    shoot(d, "collections")
    click(d, "the memory link", "#nav a[href='#/memory']")
    wait(d, "the store listed", lambda d: d.find_elements(By.XPATH, "//div[@id='stores-list']//td[.='notes']"))
    Select(d.find_element(By.CSS_SELECTOR, "#stores-list select")).select_by_value("notes")
    query = wait(d, "the search field", lambda d: d.find_element(By.CSS_SELECTOR, "#memory-store input[name=query]"))
    query.send_keys("when do deploys happen\n")
    click(d, "the hit", "#memory-hits button.link")
    wait(d, "the memory's text", lambda d: "Deploys happen on Tuesdays." in d.find_element(By.ID, "memory-text").text)
    wait(d, "its history", lambda d: d.find_elements(By.XPATH, "//div[@id='memory-view']//table//tbody/tr"))
    shoot(d, "memory")

    # Nothing the Content-Security-Policy refused, no script error.
    problems = [e for e in d.get_log("browser")
                if e["level"] == "SEVERE"
                and not (e["source"] == "network" and "/v1/health" in e["message"] and " 401 " in e["message"])]
    assert problems == [], problems


def sign_in(d, base: str, token: str):
    """Signed in with `token`, after signing out of whatever the tab held (with the
    console's own button, which stops the page's polling first)."""
    d.get(f"{base}/ui/#/")
    wait(d, "the sign-in form or the header", lambda d: d.find_elements(By.NAME, "token")
         or d.find_elements(By.CSS_SELECTOR, "#who button"))
    for out in d.find_elements(By.CSS_SELECTOR, "#who button"):
        out.click()
    field = wait(d, "the sign-in form", lambda d: d.find_element(By.NAME, "token"))
    field.send_keys(token)
    d.find_element(By.CSS_SELECTOR, "form.signin button[type=submit]").click()


def test_console_operator_page_lists_tenants_and_creates_and_revokes_a_tenant_token(daemon, browser):
    d = browser
    base = f"http://127.0.0.1:{daemon.api_port}"
    # A tenant of its own: the other tests' sandboxes of theirs do not count here.
    tenant = daemon.token("initech")
    busy = daemon.native("POST", "/v1/sandboxes", tenant, {"resources": {"memory": "128M"}, "timeout": "5m"})
    made = json.loads(daemon.operator("token", "create", "--operator", "--name", "console-test", "--json"))
    assert made["kind"] == "operator", made

    # A tenant's token: no operator page in the header.
    sign_in(d, base, tenant)
    wait(d, "the tenant in the header", lambda d: "tenant initech" in d.find_element(By.ID, "who").text)
    assert not d.find_elements(By.CSS_SELECTOR, "#nav a[href='#/operator']")
    # Nor does the operator page start for a tenant's token named to it directly.
    d.get(f"{base}/ui/#/operator")
    wait(d, "the page refusing a tenant", lambda d: d.find_elements(By.ID, "not-operator"))
    assert not d.find_elements(By.ID, "tenant-list")

    # The operator token: the operator page, with every tenant.
    sign_in(d, base, made["token"])
    wait(d, "the operator in the header", lambda d: d.find_element(By.ID, "who").text.startswith("operator"))
    click(d, "the operator link", "#nav a[href='#/operator']")
    row = wait(d, "initech in the tenants", lambda d: d.find_element(By.CSS_SELECTOR, "#tenant-list tr[data-id='initech']").text)
    assert "1 / 100" in row, row  # one live sandbox of the default quota
    wait(d, "the daemon's numbers", lambda d: "Live sandboxes" in d.find_element(By.ID, "daemon-numbers").text)
    wait(d, "the pools section", lambda d: "No warm pools" in d.find_element(By.ID, "pool-list").text)
    wait(d, "the daemon's charts", lambda d: len(d.find_elements(By.CSS_SELECTOR, "#daemon-charts svg polyline")) == 2)
    # The operator's own token is listed, revocable on the socket only.
    def own_row(d):
        r = d.find_element(By.CSS_SELECTOR, f"#token-list tr[data-id='{made['id']}']")
        return (r.text, r.find_elements(By.CSS_SELECTOR, "button"))
    text, buttons = wait(d, "the operator's own token listed", own_row)
    assert "operator" in text and not buttons, text

    # Create a tenant token whose name is markup: its secret is shown once.
    form = d.find_element(By.ID, "token-form")
    form.find_element(By.NAME, "tenant").send_keys("beta")
    form.find_element(By.NAME, "name").send_keys(MARKUP_TAG)
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    secret = wait(d, "the new token's secret", lambda d: d.find_element(By.ID, "new-token-secret").get_attribute("value"))
    assert secret.startswith("sl_"), secret
    assert daemon.native("GET", "/v1/health", secret)["tenant"] == "beta"
    row_id = wait(d, "the new token listed", lambda d: next(
        (r.get_attribute("data-id") for r in d.find_elements(By.CSS_SELECTOR, "#token-list tr[data-id]")
         if MARKUP_TAG in r.text), None))
    no_markup_ran(d)
    click(d, "the secret's done button", "#new-token button")
    wait(d, "the secret gone from the page", lambda d: not d.find_elements(By.ID, "new-token-secret"))
    # A field's value is a property, not in the page source: read every field's.
    values = d.execute_script("return Array.from(document.querySelectorAll('input'), (i) => i.value)")
    assert not any(secret in v for v in values), "the secret is left in a field"
    assert secret not in d.page_source
    shoot(d, "operator")

    # Revoke asks first: cancelling keeps it, accepting revokes it.
    row = f"#token-list tr[data-id='{row_id}']"
    click(d, "the revoke button", f"{row} button.danger")
    d.switch_to.alert.dismiss()
    assert daemon.native("GET", "/v1/health", secret)["tenant"] == "beta"
    click(d, "the revoke button", f"{row} button.danger")
    d.switch_to.alert.accept()
    wait(d, "the token shown revoked", lambda d: "revoked" in d.find_element(By.CSS_SELECTOR, row).text)
    with pytest.raises(urllib.error.HTTPError) as refused:
        daemon.native("GET", "/v1/health", secret)
    assert refused.value.code == 401

    problems = [e for e in d.get_log("browser")
                if e["level"] == "SEVERE"
                and not (e["source"] == "network" and "/v1/health" in e["message"] and " 401 " in e["message"])]
    assert problems == [], problems
    # Sign out (the page polls with the token) before the token is revoked.
    click(d, "sign out", "#who button")
    wait(d, "the sign-in form", lambda d: d.find_elements(By.NAME, "token"))
    daemon.native("DELETE", f"/v1/sandboxes/{busy['id']}", tenant)
    daemon.operator("token", "revoke", made["id"])


def put_file(daemon, token: str, sid: str, path: str, data: bytes):
    req = urllib.request.Request(
        f"{daemon.api_url}/v1/sandboxes/{sid}/files?" + urllib.parse.urlencode({"path": path}),
        method="PUT", data=data, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 201


def test_console_images_show_parents_as_a_tree_and_diff_two(daemon, browser):
    d = browser
    base = f"http://127.0.0.1:{daemon.api_port}"
    token = daemon.token("acme")
    markup_path = "/opt/<img src=x onerror=window.__xss=6>"
    first = daemon.native("POST", "/v1/sandboxes", token, {"resources": {"memory": "128M"}, "timeout": "5m"})
    put_file(daemon, token, first["id"], "/opt/one", b"one\n")
    put_file(daemon, token, first["id"], "/opt/kept", b"kept\n")
    parent = daemon.native("POST", f"/v1/sandboxes/{first['id']}/snapshot", token, {"tag": "tree:1"})
    second = daemon.native("POST", "/v1/sandboxes", token,
                           {"image": parent["id"], "resources": {"memory": "128M"}, "timeout": "5m"})
    put_file(daemon, token, second["id"], markup_path, b"two\n")
    put_file(daemon, token, second["id"], "/opt/kept", b"changed\n")
    daemon.native("DELETE", f"/v1/sandboxes/{second['id']}/files?path=/opt/one", token)
    child = daemon.native("POST", f"/v1/sandboxes/{second['id']}/snapshot", token, {"tag": "tree:2"})
    assert child["parent"] == parent["id"], child
    for sb in (first, second):
        daemon.native("DELETE", f"/v1/sandboxes/{sb['id']}", token)

    sign_in(d, base, token)
    wait(d, "the tenant in the header", lambda d: "tenant acme" in d.find_element(By.ID, "who").text)
    click(d, "the images link", "#nav a[href='#/images']")
    rows = wait(d, "both snapshots listed", lambda d: (lambda r: r if parent["id"] in r and child["id"] in r else None)(
        [r.get_attribute("data-id") for r in d.find_elements(By.CSS_SELECTOR, "#images-list tr[data-id]")]))
    # The child comes right under its parent, one level deeper.
    assert rows.index(child["id"]) == rows.index(parent["id"]) + 1, rows
    depth = lambda i: d.find_element(By.CSS_SELECTOR, f"#images-list tr[data-id='{i}']").get_attribute("data-depth")
    assert (depth(parent["id"]), depth(child["id"])) == ("0", "1")

    button = d.find_element(By.ID, "image-diff-button")
    assert not button.is_enabled()
    click(d, "the parent's compare box", f"#images-list tr[data-id='{parent['id']}'] input[name=compare]")
    click(d, "the child's compare box", f"#images-list tr[data-id='{child['id']}'] input[name=compare]")
    wait(d, "the diff button enabled", lambda d: d.find_element(By.ID, "image-diff-button").is_enabled())
    d.find_element(By.ID, "image-diff-button").click()
    result = wait(d, "the diff", lambda d: d.find_element(By.ID, "image-diff-result"))
    kind = lambda k: [e.text for e in result.find_elements(By.CSS_SELECTOR, f".diff-{k} li code")]
    assert markup_path in kind("added"), kind("added")
    assert "/opt/one" in kind("removed"), kind("removed")
    assert "/opt/kept" in kind("changed"), kind("changed")
    no_markup_ran(d)
    shoot(d, "images-tree")
    problems = [e for e in d.get_log("browser")
                if e["level"] == "SEVERE"
                and not (e["source"] == "network" and "/v1/health" in e["message"] and " 401 " in e["message"])]
    assert problems == [], problems
