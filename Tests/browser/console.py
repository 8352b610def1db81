#!/usr/bin/env python3
"""The web console in a real browser.

Headless Chromium (Debian's, driven through Selenium and Debian's chromedriver) against a real
`dredge-server` over HTTPS and a real `dredge-agent` with generated logs, all on loopback, all
started and stopped here. The browser trusts the server's certificate by its public key
(`--ignore-certificate-errors-spki-list`), nothing else.

The flow: pages without a session go to sign-in; a wrong token is refused; the right one signs
in with a Secure, HttpOnly, SameSite=Strict cookie; the agents page shows the device online,
its hostile host name as text (no script ran, no console error); the filter works; the page
holds at 1280x800 and at a narrow width; the keyboard reaches the controls; a pull asked by form
completes live; its logs are filtered by level and text; a hostile network record shows as
text, opens in the detail panel as request and response, and runs nothing; the viewer's keys
move and open records; a record's permalink and its pull's files (each downloaded) open; a
user's feedback shows in the inbox and opens the user's timeline at that moment, which then
follows what arrives; a user is watched live from their device's page (records added as text as
they are logged, filtered by level, paused and resumed, stopped); a token made
on the tokens page is shown once and the audit log's newest entry names it; signing out ends
the session, and a session of a server whose sessions last a minute is refused after it,
replayed cookie and all. Screenshots of each page go to the output folder, with console.first_page (the
first rows of a 100,000-record pull painted, against the same search through the API) in
figures.json.

    python3 Tests/browser/console.py BIN_DIR [OUT_DIR]
"""

import base64
import hashlib
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

HOSTILE_HOST = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'
HOSTILE_MESSAGE = 'hostile <script>window.pwned=4</script> "><img src=x onerror="window.pwned=5"> javascript:window.pwned=6'
HOSTILE_ATTRIBUTE = '"><img src=x onerror="window.pwned=7">'
HOSTILE_URL = 'javascript:window.pwned=8'
BULK_RECORDS = int(os.environ.get("DREDGE_CONSOLE_BULK_RECORDS", "100000"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(what, check, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.2)
    raise SystemExit(f"FAILED: {what} within {timeout:.0f} s")


def median(values):
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


# What a page must hold at a width (#50): no sideways scrolling of the page or of a table at a
# narrow width, no cell hidden, no word broken over lines a few letters at a time; at full width,
# no cell wraps but free text (messages, what users said, details). Returns the problems found.
LAYOUT = """
const problems = [];
const wide = window.innerWidth >= 1000;
const say = (what, text) => problems.push(what + ': ' + text.replace(/\\s+/g, ' ').trim().slice(0, 60));
if (document.documentElement.scrollWidth > window.innerWidth + 1) say('the page scrolls sideways', String(document.documentElement.scrollWidth));
function lines(node) {
  const range = document.createRange();
  range.selectNodeContents(node);
  const tops = Array.from(range.getClientRects()).filter(r => r.width > 0 && r.height > 0).map(r => r.top).sort((a, b) => a - b);
  let count = 0, last = -1e9;
  for (const top of tops) { if (top - last > 8) { count++; last = top; } }
  return count;
}
for (const cell of document.querySelectorAll('main td, main th')) {
  const text = cell.textContent.trim();
  if (!text) continue;
  if (cell.closest('thead') && getComputedStyle(cell.closest('thead')).display === 'none') continue;
  if (cell.closest('aside') && !cell.closest('aside').offsetParent) continue;
  if (cell.offsetParent === null) { say('a cell is hidden', text); continue; }
  const words = text.split(/\\s+/).length;
  const n = lines(cell);
  if (n > words && text.length / n < 8) say('broken a few letters at a time (' + n + ' lines)', text);
  if (wide && n > 1 && !cell.closest('.message, .said, .detail, .wrap') && !cell.querySelector('br, small')) say('wraps at full width (' + n + ' lines)', text);
}
for (const wrap of document.querySelectorAll('.table-wrap')) {
  const overflow = getComputedStyle(wrap).overflowX;
  if (wrap.scrollWidth > wrap.clientWidth + 1 && !['auto', 'scroll'].includes(overflow)) say('a table is cut', wrap.textContent);
  if (!wide && wrap.scrollWidth > wrap.clientWidth + 1) say('a table scrolls sideways', wrap.textContent);
}
return problems;
"""


def first_page(driver, base, tls, admin_token, api, pull_id, check):
    """console.first_page: from navigation to the first rows of the bulk pull painted (the
    page's first contentful paint), against the same search through the API alone on a
    kept-alive connection, and against the viewer with no rows (what any page costs the
    browser); then paging on from it. A figure, not asserted."""
    def ready():
        pull = api(f"/v1/pulls/{pull_id}?disk=false")
        if not pull["targets"] or pull["targets"][0]["status"] != "complete":
            return False
        return api("/v1/records/search", {"pull": pull_id, "limit": 1})["indexing"] == 0
    wait("the bulk pull is complete and indexed", ready, timeout=900)
    total = 0
    page = {"pull": pull_id, "limit": 5000}
    while True:
        found = api("/v1/records/search", page)
        total += len(found["records"])
        if "next" not in found:
            break
        page["after"] = found["next"]

    def painted(url, rows=200):
        """[first contentful paint, request to response end]: the page's first paint holds its
        rows (one response; the style sheet and script are cached)."""
        driver.get(url)
        WebDriverWait(driver, 60).until(lambda d: d.execute_script("return performance.getEntriesByName('first-contentful-paint').length") > 0)
        check(len(driver.find_elements(By.CSS_SELECTOR, "table.logs tbody tr")) == rows, f"{rows} rows of the bulk pull")
        return driver.execute_script("""
            const n = performance.getEntriesByType('navigation')[0];
            return [performance.getEntriesByName('first-contentful-paint')[0].startTime, n.responseEnd - n.requestStart];""")

    url = f"{base}/console/logs?pull={pull_id}"
    measured = [painted(url) for _ in range(7)]
    console_ms = [m[0] for m in measured]
    # The floor: the viewer with nothing asked (its header and form, no rows), painted.
    empty_ms = median([painted(f"{base}/console/logs", rows=0)[0] for _ in range(5)])
    host, port = base.removeprefix("https://").split(":")
    connection = http.client.HTTPSConnection(host, int(port), context=tls, timeout=30)
    api_ms = []
    for _ in range(7):
        begun = time.perf_counter()
        connection.request("POST", "/v1/records/search", body=json.dumps({"pull": pull_id, "limit": 200}),
                           headers={"Authorization": f"Bearer {admin_token}", "Content-Type": "application/json"})
        answer = connection.getresponse()
        body = answer.read()
        api_ms.append((time.perf_counter() - begun) * 1000)
        check(answer.status == 200 and len(json.loads(body)["records"]) == 200, "the API's page of the bulk pull")
    connection.close()
    # Paging on: ten next pages, then the latest (the far end of the pull).
    driver.get(url)
    paging_ms = []
    for _ in range(10):
        next_url = driver.find_element(By.ID, "next-page").get_attribute("href")
        paging_ms.append(painted(next_url)[0])
    latest_url = driver.find_element(By.LINK_TEXT, "Latest").get_attribute("href")
    latest = [painted(latest_url) for _ in range(3)]
    warm_console, warm_api = median(console_ms[1:]), median(api_ms[1:])
    return {
        "records": total,
        "first_page_ms": round(warm_console, 1), "first_page_cold_ms": round(console_ms[0], 1),
        "page_answered_ms": round(median([m[1] for m in measured[1:]]), 1), "empty_page_ms": round(empty_ms, 1), "search_api_ms": round(warm_api, 1), "ratio_api_over_console": round(warm_api / warm_console, 2),
        "next_page_ms": round(median(paging_ms), 1), "latest_page_ms": round(median([m[0] for m in latest]), 1), "latest_answered_ms": round(median([m[1] for m in latest]), 1),
    }


def main():
    bin_dir = os.path.abspath(sys.argv[1])
    out = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else "test-output/console")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    work = tempfile.mkdtemp(prefix="dredge-console-")
    processes = []
    driver = None
    try:
        data = os.path.join(work, "server")
        init = subprocess.run([f"{bin_dir}/dredge-server", "init", "--data", data], check=True, capture_output=True, text=True).stdout
        words = init.split()
        enrollment = next(w for w in words if w.startswith("dredge_enr_"))
        admin_token = next(w for w in words if w.startswith("dredge_adm_"))
        agent_port, admin_port = free_port(), free_port()
        server_log = open(os.path.join(work, "server.log"), "w")
        processes.append(subprocess.Popen(
            [f"{bin_dir}/dredge-server", "run", "--data", data, "--agent-port", str(agent_port), "--admin-port", str(admin_port),
             "--heartbeat-seconds", "2"], stdout=server_log, stderr=server_log))
        base = f"https://127.0.0.1:{admin_port}"
        tls = ssl.create_default_context(cafile=os.path.join(data, "ca.pem"))

        def api(path, body=None):
            request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {admin_token}", "Content-Type": "application/json"},
                                             data=None if body is None else json.dumps(body).encode())
            with urllib.request.urlopen(request, context=tls, timeout=30) as answer:
                return json.load(answer)

        wait("the server answers", lambda: api("/health")["status"] == "ok")

        # Two devices: an oven, and one whose logs name a hostile host.
        for name, host, uids, records in [("kitchen", "kitchen-oven-0042", "u-1,u-2", 3000), ("hostile", HOSTILE_HOST, "u-3", 3000),
                                          ("bulk", "bulk-oven-0100", "u-bulk", BULK_RECORDS)]:
            device = os.path.join(work, name)
            store = os.path.join(device, "logs.sqlite")
            subprocess.run([f"{bin_dir}/dredge-demo", "generate", "--store", store, "--uids", uids, "--records", str(records), "--seed", "1",
                            "--host", host], check=True, capture_output=True)
            state = os.path.join(device, "agent")
            subprocess.run([f"{bin_dir}/dredge-agent", "enroll", "--state", state, "--server", f"localhost:{agent_port}", "--ca",
                            os.path.join(data, "ca.pem"), "--token", enrollment, "--app", "oven"], check=True, capture_output=True)
            agent_log = open(os.path.join(device, "agent.log"), "w")
            processes.append(subprocess.Popen([f"{bin_dir}/dredge-agent", "run", "--state", state, "--store", store, "--app", "oven"],
                                              stdout=agent_log, stderr=agent_log))
        wait("the agents are online and described",
             lambda: sorted(a["hostname"] for a in api("/v1/agents") if a["connected"]) == sorted([HOSTILE_HOST, "kitchen-oven-0042", "bulk-oven-0100"]))
        # A record whose message and metadata are hostile, in u-2's logs: a network record naming a javascript: URL.
        kitchen = os.path.join(work, "kitchen")
        subprocess.run([f"{bin_dir}/dredge-agent", "log", "--store", os.path.join(kitchen, "logs.sqlite"), "--uid", "u-2", "--level", "error",
                        "--type", "network", "--meta", "method=GET", "--meta", f"url={HOSTILE_URL}", "--meta", "status=503",
                        "--meta", "correlation_id=corr-hostile-1", "--meta", f"note={HOSTILE_ATTRIBUTE}", HOSTILE_MESSAGE], check=True, capture_output=True)
        # The bulk device's every record, pulled through the API while the browser starts: the first-page figure reads it.
        bulk_agent = next(a["agentID"] for a in api("/v1/agents") if a["hostname"] == "bulk-oven-0100")
        bulk_pull = api("/v1/pulls", {"agent": bulk_agent, "filter": {}})["id"]

        # The browser trusts the admin listener's key, and only that.
        # A second server whose console sessions last a minute, reached as localhost (cookies do
        # not tell ports apart): a session is signed in there first and found expired at the end.
        short_data = os.path.join(work, "short")
        short_words = subprocess.run([f"{bin_dir}/dredge-server", "init", "--data", short_data], check=True, capture_output=True, text=True).stdout.split()
        short_token = next(w for w in short_words if w.startswith("dredge_adm_"))
        short_port = free_port()
        short_base = f"https://localhost:{short_port}"
        # The short server also signs people in through a real OpenID Connect provider
        # (Tests/sso/oidc_provider.py: django-oauth-toolkit on loopback), by their groups (#55).
        provider_dir = os.path.join(work, "provider")
        os.makedirs(provider_dir)
        provider_log = open(os.path.join(work, "provider.log"), "w")
        provider_process = subprocess.Popen(
            [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sso", "oidc_provider.py"), "--state-dir", provider_dir,
             "--console-redirect", short_base + "/console/sso/callback"], stdout=subprocess.PIPE, stderr=provider_log, text=True)
        processes.append(provider_process)
        provider = json.loads(provider_process.stdout.readline() or "null") or (_ for _ in ()).throw(SystemExit("FAILED: the OpenID Connect provider did not start"))
        with open(os.path.join(short_data, "sso-secret"), "w") as f:
            f.write(provider["console"]["secret"])
        short_config_path = os.path.join(short_data, "server.json")
        short_config = json.load(open(short_config_path))
        short_config["sso"] = {"issuer": provider["issuer"], "clientID": "dredge-console", "clientSecretFile": "sso-secret",
                               "redirectURL": short_base + "/console/sso/callback", "investigators": ["dredge-investigators"], "readers": ["dredge-readers"]}
        json.dump(short_config, open(short_config_path, "w"))
        short_log = open(os.path.join(work, "short.log"), "w")
        processes.append(subprocess.Popen(
            [f"{bin_dir}/dredge-server", "run", "--data", short_data, "--agent-port", str(free_port()), "--admin-port", str(short_port),
             "--console-session-minutes", "1"], stdout=short_log, stderr=short_log))

        def spki_hash(directory):
            certificate = x509.load_pem_x509_certificate(open(os.path.join(directory, "server.pem"), "rb").read())
            key = certificate.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
            return base64.b64encode(hashlib.sha256(key).digest()).decode()
        options = Options()
        for flag in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,800",
                     f"--ignore-certificate-errors-spki-list={spki_hash(data)},{spki_hash(short_data)}",
                     f"--user-data-dir={os.path.join(work, 'chromium')}"]:
            options.add_argument(flag)
        options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options)
        driver.set_page_load_timeout(30)

        def shot(name):
            driver.save_screenshot(os.path.join(out, name + ".png"))

        def check(condition, message):
            if not condition:
                shot("failure")
                text = driver.find_element(By.TAG_NAME, "body").text[:500]
                raise SystemExit(f"FAILED: {message} (at {driver.current_url}; the page says: {text!r})")

        def at(url, message):
            """Waits for the browser to be at `url` (a click navigates after it returns)."""
            try:
                WebDriverWait(driver, 15).until(lambda d: d.current_url == url and d.execute_script("return document.readyState") == "complete")
            except Exception:
                check(False, message)

        def reloading_until(condition, seconds, message):
            """Reloads the page once a second until `condition` holds (a page that is not live)."""
            def holds(d):
                if condition(d):
                    return True
                d.refresh()
                return False
            try:
                WebDriverWait(driver, seconds, poll_frequency=1).until(holds)
            except Exception:
                check(False, message)

        def console_errors():
            return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]

        # On the short server: signed in, the cookie kept for later.
        driver.get(short_base + "/console/sign-in")
        WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.ID, "token"))
        driver.find_element(By.ID, "token").send_keys(short_token)
        driver.find_element(By.CSS_SELECTOR, "form.sign-in button").click()
        at(short_base + "/console/agents", "signing in on the short server")
        short_cookie = driver.get_cookie("dredge_console")
        check(short_cookie is not None, "a session on the short server")
        short_expires = time.monotonic() + 62

        # Without a session: the sign-in page.
        driver.get(base + "/console/agents")
        at(base + "/console/sign-in?return=%2Fconsole%2Fagents", "a page without a session goes to sign-in, naming it")
        shot("1-sign-in")

        # A wrong token is refused.
        driver.find_element(By.ID, "token").send_keys("dredge_adm_wrong")
        driver.find_element(By.CSS_SELECTOR, "form.sign-in button").click()
        WebDriverWait(driver, 15).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".problem"))
        check("That is not an admin token" in driver.find_element(By.CSS_SELECTOR, ".problem").text, "a wrong token is refused")
        check(not any(c["name"] == "dredge_console" for c in driver.get_cookies()), "no session for a wrong token")

        driver.get_log("browser")  # the refused sign-in's 401 is logged as an error: expected

        # The right one signs in.
        driver.find_element(By.ID, "token").send_keys(admin_token)
        driver.find_element(By.CSS_SELECTOR, "form.sign-in button").click()
        at(base + "/console/agents", "signing in leads to the agents")
        session = next((c for c in driver.get_cookies() if c["name"] == "dredge_console"), None)
        check(session is not None and session["httpOnly"] and session["secure"] and session.get("sameSite") == "Strict",
              f"the session cookie is HttpOnly, Secure and SameSite=Strict: {session}")

        # The agent, its hostile host name shown as text and inert.
        rows = driver.find_elements(By.CSS_SELECTOR, "tbody tr")
        check(len(rows) == 3 and all("online" in r.text and "oven" in r.text for r in rows), "the agents are listed online")
        check(any(HOSTILE_HOST in r.text for r in rows), "the hostile host name is shown as written")
        check(driver.execute_script("return window.pwned === undefined"), "no script from the host name ran")
        check(not driver.find_elements(By.CSS_SELECTOR, "tbody img, tbody script"), "no element came from the host name")
        check(driver.find_element(By.CSS_SELECTOR, "header").value_of_css_property("display") == "flex", "the style sheet applies")
        errors = console_errors()
        check(errors == [], f"no console errors (a CSP refusal would be one): {errors}")
        shot("2-agents")

        # The filter.
        box = driver.find_element(By.ID, "q")
        box.send_keys("no such device")
        box.submit()
        at(base + "/console/agents?q=no+such+device", "the filter is a plain GET")
        check("No agent matches" in driver.find_element(By.CSS_SELECTOR, "tbody").text, "a filter matching nothing shows none")
        box = driver.find_element(By.ID, "q")
        box.clear()
        box.send_keys("U-2")
        box.submit()
        at(base + "/console/agents?q=U-2", "the filter is a plain GET")
        rows = driver.find_elements(By.CSS_SELECTOR, "tbody tr")
        check(len(rows) == 1 and "kitchen-oven-0042" in rows[0].text, "a filter by user finds its agent only")
        shot("3-agents-filtered")

        # Narrow.
        driver.set_window_size(420, 800)
        check(driver.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1"), "no sideways scrolling at 420 px")
        shot("4-agents-narrow")
        driver.set_window_size(1280, 800)

        # Keyboard: the filter, then the sign-out button, are reachable with Tab.
        reached = set()
        body = driver.find_element(By.TAG_NAME, "body")
        for _ in range(14):
            body.send_keys("\ue004")  # Tab
            active = driver.switch_to.active_element
            reached.add(active.get_attribute("id") or active.text)
        check("q" in reached and "Sign out" in reached, f"keyboard reaches the filter and sign-out: {reached}")

        # A pull of u-2 through the form; its page follows the upload live (server-sent events,
        # no reload) until the device's files are on the server.
        driver.find_element(By.LINK_TEXT, "Pulls").click()
        at(base + "/console/pulls", "the Pulls link")
        driver.find_element(By.LINK_TEXT, "New pull").click()
        at(base + "/console/pulls/new", "the New pull link")
        driver.find_element(By.ID, "uid").send_keys("u-2")
        driver.find_element(By.CSS_SELECTOR, "input[name=level-warning]").click()
        driver.find_element(By.CSS_SELECTOR, "input[name=level-error]").click()
        driver.find_element(By.ID, "reason").send_keys("TICKET-7")
        shot("5-new-pull")
        driver.find_element(By.CSS_SELECTOR, "form.pull button").click()
        WebDriverWait(driver, 15).until(lambda d: "/console/pulls/" in d.current_url and d.current_url != base + "/console/pulls/new")
        page_id = driver.execute_script("return window.performance.timeOrigin")
        try:
            WebDriverWait(driver, 90).until(lambda d: d.find_element(By.CSS_SELECTOR, "tbody .status").text == "complete")
        except Exception:
            check(False, "the pull page shows the upload complete")
        check(driver.execute_script("return window.performance.timeOrigin") == page_id, "it became complete without a reload")
        check("files" in driver.find_element(By.CSS_SELECTOR, "tbody .files").text, "the files are counted")
        WebDriverWait(driver, 10).until(lambda d: d.find_element(By.ID, "live").text == "Finished.")
        shot("6-pull-complete")

        # Its logs: the records that arrived, searchable once indexed, warnings and errors only.
        driver.find_element(By.LINK_TEXT, "Read its logs").click()
        reloading_until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.logs tbody tr"), 60, "the pull's records are listed")
        levels = {c.text for c in driver.find_elements(By.CSS_SELECTOR, "table.logs td.level")}
        check(levels and levels <= {"warning", "error", "critical"}, f"only what was pulled: {levels}")
        check(all(c.text == "u-2" for c in driver.find_elements(By.CSS_SELECTOR, "table.logs tbody tr td:nth-child(6)")), "only u-2's records")
        shot("6b-logs")
        # Its counts and histogram (#50): dragging across the middle of the bars narrows the time.
        total = driver.find_element(By.CSS_SELECTOR, "section.stats strong").text
        check(total.endswith("records match.") and driver.find_elements(By.CSS_SELECTOR, "figure.histogram rect"), f"the counts and the histogram: {total!r}")
        svg = driver.find_element(By.CSS_SELECTOR, "figure.histogram svg")
        width = svg.size["width"]
        logs_url = driver.current_url
        ActionChains(driver).move_to_element_with_offset(svg, int(-width * 0.3), 0).click_and_hold().move_by_offset(int(width * 0.4), 0).release().perform()
        WebDriverWait(driver, 15).until(lambda d: "since=" in d.current_url and "until=" in d.current_url)
        narrowed = driver.find_element(By.CSS_SELECTOR, "section.stats strong").text
        check(int(narrowed.split()[0].replace(",", "")) < int(total.split()[0].replace(",", "")), f"a drag narrows the time: {total!r} then {narrowed!r}")
        shot("6f-logs-zoomed")
        driver.get(logs_url)
        driver.set_window_size(420, 800)
        check(driver.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1"), "the viewer: no sideways scrolling at 420 px")
        shot("6b-logs-narrow")
        driver.set_window_size(1280, 800)

        # The filter bar: errors with a word, then the hostile network record, all of it inert text.
        def search(**fields):
            for name in ["host", "app", "level", "type", "text", "where", "since", "until"]:
                box = driver.find_element(By.CSS_SELECTOR, f"form.logs input[name={name}]")
                box.clear()
                if name in fields:
                    box.send_keys(fields[name])
            page = driver.execute_script("return window.performance.timeOrigin")
            driver.find_element(By.CSS_SELECTOR, "form.logs button").click()
            WebDriverWait(driver, 15).until(
                lambda d: d.execute_script("return window.performance.timeOrigin") != page and d.execute_script("return document.readyState") == "complete")

        search(level="error", text="declined")
        rows = driver.find_elements(By.CSS_SELECTOR, "table.logs tbody tr")
        check(rows and all(r.find_element(By.CSS_SELECTOR, "td.level").text == "error" and "declined" in r.text for r in rows),
              f"level and text narrow the list: {[r.text[:80] for r in rows[:3]]}")
        search(type="network", text="hostile")
        rows = driver.find_elements(By.CSS_SELECTOR, "table.logs tbody tr")
        check(len(rows) == 1 and HOSTILE_MESSAGE in rows[0].text, f"the hostile record is listed as written: {[r.text for r in rows]}")
        check(driver.execute_script("return window.pwned === undefined"), "nothing in the record ran")
        check(not driver.find_elements(By.CSS_SELECTOR, "main img, main script, a[href^='javascript']"), "no element came from the record")

        # Opened in the detail panel (no navigation): the request and the response.
        page_id = driver.execute_script("return window.performance.timeOrigin")
        rows[0].find_element(By.CSS_SELECTOR, "td.message").click()
        WebDriverWait(driver, 15).until(lambda d: d.find_elements(By.CSS_SELECTOR, "aside.detail article.record"))
        panel = driver.find_element(By.CSS_SELECTOR, "aside.detail")
        check(panel.find_element(By.CSS_SELECTOR, ".request-line").text == f"GET {HOSTILE_URL}", "the request line, as text")
        check("corr-hostile-1" in panel.text and "503" in panel.find_element(By.CSS_SELECTOR, "dl.response").text, "the correlation id and the status")
        check(HOSTILE_ATTRIBUTE in panel.find_element(By.CSS_SELECTOR, "table.metadata").text, "the hostile metadata, as text")
        check(driver.execute_script("return window.performance.timeOrigin") == page_id, "the panel opened without leaving the page")
        check(driver.execute_script("return window.pwned === undefined") and not driver.find_elements(By.CSS_SELECTOR, "main img, main script, a[href^='javascript']"),
              "nothing in the opened record ran")
        shot("6c-network-record")

        # Keyboard: Escape closes; j selects the first row, Enter opens it.
        driver.switch_to.active_element.send_keys("\ue00c")  # Escape
        WebDriverWait(driver, 5).until(lambda d: not d.find_element(By.CSS_SELECTOR, "aside.detail").is_displayed())
        search(level="warning+")
        driver.execute_script("document.activeElement.blur()")
        ActionChains(driver).send_keys("j").send_keys("j").perform()
        active = driver.switch_to.active_element
        rows = driver.find_elements(By.CSS_SELECTOR, "table.logs tbody tr")
        check(len(rows) > 2 and active.get_attribute("href") == rows[1].find_element(By.CSS_SELECTOR, "a.open").get_attribute("href"),
              "j moves to the next record")
        active.send_keys("\ue007")  # Enter
        WebDriverWait(driver, 15).until(lambda d: d.find_elements(By.CSS_SELECTOR, "aside.detail article.record"))
        opened = driver.find_element(By.CSS_SELECTOR, "aside.detail article.record")
        check(rows[1].find_element(By.CSS_SELECTOR, "td.message").text.split("\n")[0] in opened.text, "Enter opens the record selected")
        check(opened.find_elements(By.CSS_SELECTOR, "table.context tr.current"), "with its context around it")
        driver.switch_to.active_element.send_keys("j")
        WebDriverWait(driver, 15).until(
            lambda d: rows[2].find_element(By.CSS_SELECTOR, "td.message").text.split("\n")[0] in d.find_element(By.CSS_SELECTOR, "aside.detail").text)

        # The permalink: the record's own page; from it, the files of its pull, each a download.
        driver.find_element(By.CSS_SELECTOR, "aside.detail a.permalink").click()
        WebDriverWait(driver, 15).until(lambda d: "/console/records/" in d.current_url)
        check(driver.find_elements(By.CSS_SELECTOR, "main article.record table.context tr.current"), "the record's page")
        shot("6d-record")
        driver.find_element(By.PARTIAL_LINK_TEXT, "Files of this pull").click()
        WebDriverWait(driver, 15).until(lambda d: d.current_url.endswith("/files"))
        links = driver.find_elements(By.CSS_SELECTOR, "table.files a[download]")
        check(any(l.text == "manifest.json" for l in links) and any(l.text.endswith(".jsonl") for l in links), f"the files: {[l.text for l in links]}")
        sizes = driver.execute_script("""
            const links = Array.from(document.querySelectorAll('table.files a[download]'));
            return Promise.all(links.map(l => fetch(l.href).then(r => r.ok ? r.arrayBuffer().then(b => b.byteLength) : -r.status)));""")
        check(all(size > 0 for size in sizes), f"each file downloads through the session: {sizes}")
        shot("6e-files")

        # A user's feedback arrives with their logs and shows in the inbox.
        subprocess.run([f"{bin_dir}/dredge-agent", "feedback", "--state", os.path.join(kitchen, "agent"), "--store", os.path.join(kitchen, "logs.sqlite"),
                        "--uid", "u-1", "--text", "the oven <b>beeps</b> all night"], check=True, capture_output=True, timeout=120)
        driver.find_element(By.LINK_TEXT, "Feedback").click()
        at(base + "/console/feedback", "the Feedback link")
        reloading_until(lambda d: d.find_elements(By.CSS_SELECTOR, "tbody td.said") and "complete" in d.find_element(By.CSS_SELECTOR, "tbody tr").text,
                        90, "the feedback arrives complete")
        check(driver.find_element(By.CSS_SELECTOR, "tbody td.said").text == "the oven <b>beeps</b> all night", "what the user said, as text")
        check("kitchen-oven-0042" in driver.find_element(By.CSS_SELECTOR, "tbody tr").text, "from their device")
        shot("7-feedback")
        driver.find_element(By.CSS_SELECTOR, "tbody tr a.moment").click()
        reloading_until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.logs tbody tr"), 60, "the user's timeline at the feedback")
        users = {c.text for c in driver.find_elements(By.CSS_SELECTOR, "table.logs tbody tr td:nth-child(6)")}
        check(users == {"u-1"} and driver.find_elements(By.CSS_SELECTOR, "table.logs tbody tr.current:last-child"),
              f"u-1's records up to that moment, the last one marked: {users}")
        shot("7b-feedback-moment")

        # Following: the last page adds what arrives after it (another feedback's records), as text.
        before_rows = len(driver.find_elements(By.CSS_SELECTOR, "table.logs tbody tr"))
        driver.find_element(By.ID, "follow").click()
        WebDriverWait(driver, 10).until(lambda d: d.find_element(By.ID, "follow").get_attribute("aria-pressed") == "true")
        subprocess.run([f"{bin_dir}/dredge-agent", "feedback", "--state", os.path.join(kitchen, "agent"), "--store", os.path.join(kitchen, "logs.sqlite"),
                        "--uid", "u-1", "--text", "and again"], check=True, capture_output=True, timeout=120)
        try:
            WebDriverWait(driver, 90).until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.logs tbody tr.arrived"))
        except Exception:
            check(False, "records that arrive are added while following")
        arrived = driver.find_elements(By.CSS_SELECTOR, "table.logs tbody tr.arrived")
        check(len(driver.find_elements(By.CSS_SELECTOR, "table.logs tbody tr")) == before_rows + len(arrived), "added below, none replaced")
        check(all(r.find_element(By.CSS_SELECTOR, "td:nth-child(6)").text == "u-1" for r in arrived[:50]), "only the user's records")
        check(arrived[0].find_element(By.CSS_SELECTOR, "a.open").get_attribute("href").startswith(base + "/console/records/"), "each with its permalink")
        shot("7c-following")
        driver.find_element(By.ID, "follow").click()
        check(driver.find_element(By.ID, "follow").get_attribute("aria-pressed") == "false", "following stops")

        # Watch live (#53): from the device's page, a tail of u-1 at warning and above; the records
        # it logs are added as they are held, as text; paused, they wait; resumed, they come; stopped, it ends.
        kitchen_id = next(a["agentID"] for a in api("/v1/agents") if a["hostname"] == "kitchen-oven-0042")
        driver.get(base + f"/console/agents/{kitchen_id}")
        watch = [a for a in driver.find_elements(By.CSS_SELECTOR, "a.watch") if "uid=u-1&" in a.get_attribute("href")]
        check(len(watch) == 1, "the device's page offers to watch u-1 live")
        watch[0].click()
        WebDriverWait(driver, 15).until(lambda d: "/console/tails/new" in d.current_url)
        check(driver.find_element(By.ID, "uid").get_attribute("value") == "u-1", "the form names the user")
        check(driver.find_element(By.CSS_SELECTOR, f"#agent option[value='{kitchen_id}']").is_selected(), "and the device")
        driver.find_element(By.ID, "level").send_keys("warning+")
        driver.find_element(By.ID, "reason").send_keys("SUP-LIVE")
        driver.find_element(By.CSS_SELECTOR, "form.tail button[type=submit]").click()
        WebDriverWait(driver, 15).until(lambda d: "/console/tails/" in d.current_url and "/new" not in d.current_url)
        tail_id = driver.current_url.rsplit("/", 1)[1]
        try:
            WebDriverWait(driver, 60).until(lambda d: d.find_element(By.CSS_SELECTOR, f"#devices tr[data-agent='{kitchen_id}'] span.status").text == "running")
        except Exception:
            check(False, "the device accepts the tail, shown live")
        check(driver.find_element(By.ID, "pause").is_displayed(), "the page can pause")

        def device_log(message, level="error"):
            subprocess.run([f"{bin_dir}/dredge-agent", "log", "--store", os.path.join(kitchen, "logs.sqlite"), "--uid", "u-1", "--level", level, message],
                           check=True, capture_output=True)

        def live_messages():
            return [r.text for r in driver.find_elements(By.CSS_SELECTOR, "#live-records tbody td.message")]

        device_log("live: below the tail's level", level="info")
        device_log("live: the door opened")
        device_log(HOSTILE_MESSAGE, level="warning")
        try:
            WebDriverWait(driver, 60).until(lambda d: len(live_messages()) >= 2)
        except Exception:
            check(False, "records logged during the tail arrive on the page")
        check(live_messages() == ["live: the door opened", HOSTILE_MESSAGE], f"in order, filtered by level, as text: {live_messages()}")
        check(driver.execute_script("return window.pwned === undefined") and not driver.find_elements(By.CSS_SELECTOR, "#live-records img, #live-records script"),
              "a hostile record runs nothing")
        row = driver.find_element(By.CSS_SELECTOR, "#live-records tbody tr")
        check(row.find_element(By.CSS_SELECTOR, "td[data-label=Host]").text == "kitchen-oven-0042" and row.find_element(By.CSS_SELECTOR, "td[data-label=App]").text == "dredge-agent",
              f"each with its host and app (dredge-agent log's): {row.text!r}")
        check(driver.find_element(By.CSS_SELECTOR, f"#devices tr[data-agent='{kitchen_id}'] .records").text == "2", "the device's records counted as they come")
        shot("7d-live")
        driver.find_element(By.ID, "pause").click()
        check(driver.find_element(By.ID, "pause").get_attribute("aria-pressed") == "true", "paused")
        device_log("live: while paused")
        try:
            WebDriverWait(driver, 60).until(lambda d: "1 new record(s) wait" in d.find_element(By.ID, "live").text)
        except Exception:
            check(False, "a record that arrives while paused waits, and the page says so")
        check(len(live_messages()) == 2, "and is not added while paused")
        shot("7e-live-paused")
        driver.find_element(By.ID, "pause").click()
        check(live_messages()[-1] == "live: while paused", "resumed, what waited is added")
        driver.find_element(By.ID, "stop").click()
        try:
            # The page posts and loads again: an element of the old page may go stale under the wait.
            WebDriverWait(driver, 30, ignored_exceptions=[NoSuchElementException, StaleElementReferenceException]).until(
                lambda d: d.find_element(By.ID, "tail-state").text.startswith("stopped"))
        except Exception:
            check(False, "stopping ends the tail on its page")
        check(live_messages() == ["live: the door opened", HOSTILE_MESSAGE, "live: while paused"], f"the stopped tail's page shows what it showed: {live_messages()}")
        check(driver.execute_script("return window.pwned === undefined"), "rendered by the server, the hostile record runs nothing either")
        stopped = api(f"/v1/tails/{tail_id}")
        check(stopped["stopped"]["by"] == "admin" and stopped["reason"] == "SUP-LIVE" and stopped["parts"][0]["records"] == 3,
              f"stopped, by the engineer, with what it showed: {stopped['stopped']}, {stopped['parts']}")
        errors = console_errors()
        check(errors == [], f"no console errors on the live page: {errors}")
        shot("7f-live-stopped")

        # Tokens: a new one is shown once; the audit log names who made it.
        driver.find_element(By.LINK_TEXT, "Tokens").click()
        at(base + "/console/tokens", "the Tokens link")
        driver.find_element(By.ID, "name").send_keys("carol")
        driver.find_element(By.CSS_SELECTOR, "form.create button").click()
        WebDriverWait(driver, 15).until(lambda d: d.find_elements(By.CSS_SELECTOR, "code.token"))
        new_token = driver.find_element(By.CSS_SELECTOR, "code.token").text
        check(new_token.startswith("dredge_adm_"), f"the new token is shown: {new_token!r}")
        shot("8-tokens-created")
        driver.get(base + "/console/tokens")
        at(base + "/console/tokens", "the tokens page again")
        check(new_token not in driver.page_source and "carol" in driver.page_source, "the token is shown once, its name stays")
        # A form whose CSRF token was taken out is refused, and makes nothing.
        driver.execute_script("document.querySelector('form.create input[name=csrf]').remove()")
        driver.find_element(By.ID, "name").send_keys("mallory")
        driver.find_element(By.CSS_SELECTOR, "form.create button").click()
        WebDriverWait(driver, 15).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".problem"))
        check("nothing was done" in driver.find_element(By.CSS_SELECTOR, ".problem").text, "a post without its CSRF token is refused")
        check(all(t["name"] != "mallory" for t in api("/v1/tokens")), "and made no token")
        driver.get_log("browser")  # the refused post's 403 is logged as an error: expected
        driver.get(base + "/console/tokens")
        at(base + "/console/tokens", "the session outlives a refused post")
        driver.find_element(By.LINK_TEXT, "Audit log").click()
        at(base + "/console/audit", "the Audit log link")
        rows = [r.text for r in driver.find_elements(By.CSS_SELECTOR, "tbody tr")]
        check(rows and "token.create" in rows[0] and "carol" in rows[0] and "admin" in rows[0], f"the newest entry is the token made: {rows[:2]}")
        check(any(r.split()[4:6] == ["admin", "pull"] and "TICKET-7" in r for r in rows), f"the pull is recorded with its reason: {rows[:4]}")
        check(any("auth.failed" in r for r in rows) and any("console.sign-in" in r for r in rows), "the refused and the accepted sign-ins are recorded")
        shot("9-audit")
        driver.find_element(By.LINK_TEXT, "Pulls").click()
        at(base + "/console/pulls", "the Pulls link")
        check(len(driver.find_elements(By.CSS_SELECTOR, "tbody tr")) == 2, "both pulls are listed")
        shot("9b-pulls")
        errors = console_errors()
        check(errors == [], f"no console errors: {errors}")

        # Every page at 420 px and at 1,400 px (#50): nothing broken letter by letter, nothing cut,
        # nothing wrapping that fits.
        driver.get(base + "/console/agents")
        agent_page = driver.find_element(By.CSS_SELECTOR, "tbody tr td:nth-child(2) a").get_attribute("href")
        driver.get(base + "/console/pulls")
        pull_page = driver.find_element(By.CSS_SELECTOR, "tbody tr td:first-child a").get_attribute("href")
        driver.get(pull_page)
        logs_page = driver.find_element(By.LINK_TEXT, "Read its logs").get_attribute("href")
        files_page = driver.find_element(By.LINK_TEXT, "Files").get_attribute("href")
        driver.get(logs_page)
        record_page = driver.find_element(By.CSS_SELECTOR, "table.logs tbody tr a.open").get_attribute("href")
        tour = [base + "/console/agents", agent_page, base + "/console/pulls", pull_page, base + "/console/pulls/new", logs_page, record_page,
                files_page, base + "/console/feedback", base + "/console/tokens", base + "/console/audit", pull_page + "/remove",
                base + "/console/tokens/revoke?kind=admin&name=carol"]
        for width in [420, 1400]:
            driver.set_window_size(width, 900)
            for url in tour:
                driver.get(url)
                problems = driver.execute_script(LAYOUT)
                check(problems == [], f"{url[len(base):]} at {width} px: {problems[:6]}")
            shot(f"11-tour-end-{width}")
        driver.set_window_size(1280, 800)

        # Revoking a token asks first; the question's Cancel changes nothing.
        driver.get(base + "/console/tokens")
        driver.find_element(By.CSS_SELECTOR, "a.revoke[href*='name=carol']").click()
        WebDriverWait(driver, 15).until(lambda d: "/console/tokens/revoke" in d.current_url)
        check("Revoke the admin token “carol”?" in driver.find_element(By.TAG_NAME, "h1").text, "revoking asks first")
        shot("8b-revoke-question")
        driver.find_element(By.LINK_TEXT, "Cancel").click()
        at(base + "/console/tokens", "Cancel goes back")
        check(any(t["name"] == "carol" for t in api("/v1/tokens")), "asking revoked nothing")

        figures = first_page(driver, base, tls, admin_token, api, bulk_pull, check)
        with open(os.path.join(out, "figures.json"), "w") as f:
            json.dump(figures, f, indent=2)
        print("console.first_page: " + json.dumps(figures))
        # The same as the benchmarks' figure lines (value, the limit measured in the same run, ratio).
        f = figures
        print(f"figure: console.first_page value={f['first_page_ms']} ms limit={f['search_api_ms']} ms ratio={f['ratio_api_over_console']} "
              f"(first rows of a {f['records']}-record pull painted ÷ the same search through the API; goal < 1000 ms, ratio ≥ 0.5)")
        print(f"figure: console.first_page.over_empty value={f['first_page_ms']} ms limit={f['empty_page_ms']} ms "
              f"ratio={round(f['empty_page_ms'] / f['first_page_ms'], 2)} (the viewer with no rows painted ÷ the first page; informative)")
        print(f"figure: console.next_page value={f['next_page_ms']} ms (informative)")
        print(f"figure: console.latest_page value={f['latest_page_ms']} ms (informative)")

        # A planned restart (#50): the server stops (SIGTERM) and starts again on the same ports.
        # The console's session survives it (sessions are kept in the database), and the agents,
        # told when it would be back, return by themselves.
        processes[0].terminate()
        processes[0].wait(timeout=60)
        restart_log = open(os.path.join(work, "server-restarted.log"), "w")
        processes[0] = subprocess.Popen(
            [f"{bin_dir}/dredge-server", "run", "--data", data, "--agent-port", str(agent_port), "--admin-port", str(admin_port),
             "--heartbeat-seconds", "2"], stdout=restart_log, stderr=restart_log)
        restarted = time.monotonic()
        wait("the restarted server answers", lambda: api("/health")["status"] == "ok")
        wait("the agents are back after the restart", lambda: sum(1 for a in api("/v1/agents") if a["connected"]) == 3, timeout=90)
        print(f"agents back {time.monotonic() - restarted:.1f} s after the server was started again")
        driver.get(base + "/console/agents")
        at(base + "/console/agents", "the console's session survives a restart of the server")
        rows = driver.find_elements(By.CSS_SELECTOR, "tbody tr")
        check(len(rows) == 3 and all("online" in r.text for r in rows), "after the restart the agents are listed online")

        # Sign out: back to sign-in, and the session is gone.
        driver.find_element(By.CSS_SELECTOR, "form.sign-out button").click()
        at(base + "/console/sign-in", "signing out leads to sign-in")
        check(not any(c["name"] == "dredge_console" for c in driver.get_cookies()), "signing out clears the cookie")
        driver.get(base + "/console/agents")
        at(base + "/console/sign-in?return=%2Fconsole%2Fagents", "after signing out, pages need a new sign-in")
        shot("10-signed-out")

        # The short server's session has expired: the browser dropped its cookie, and the server
        # refuses it when it is sent again all the same.
        time.sleep(max(0.0, short_expires - time.monotonic()))
        driver.get(short_base + "/console/agents")
        at(short_base + "/console/sign-in?return=%2Fconsole%2Fagents", "an expired session leads to sign-in")
        check(driver.get_cookie("dredge_console") is None, "the browser dropped the expired cookie")
        driver.add_cookie({"name": "dredge_console", "value": short_cookie["value"], "path": "/console", "secure": True, "httpOnly": True, "sameSite": "Strict"})
        driver.get(short_base + "/console/agents")
        at(short_base + "/console/sign-in?return=%2Fconsole%2Fagents", "the expired cookie sent again is refused")

        # Single sign-on (#55): "Sign in with single sign-on" goes to the company's provider; alice
        # signs in on its own page and comes back an investigator, by her group; signing out
        # ends her session here and at the provider; mallory, in no group of Dredge's, is refused.
        def sso_sign_in(person):
            driver.get(short_base + "/console/sign-in")
            driver.find_element(By.LINK_TEXT, "Sign in with single sign-on").click()
            try:
                WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.NAME, "username"))
            except Exception:
                check(False, f"single sign-on shows the provider's sign-in page to {person}")
            check(driver.current_url.startswith(provider["issuer"].rsplit("/o", 1)[0] + "/accounts/login/"), "single sign-on opens the provider's own sign-in page")
            driver.find_element(By.NAME, "username").send_keys(person)
            driver.find_element(By.NAME, "password").send_keys(provider["people"][person])
            driver.find_element(By.CSS_SELECTOR, "form button").click()
        sso_sign_in("alice")
        at(short_base + "/console/agents", "alice is signed in through the provider and lands on the agents page")
        header = driver.find_element(By.CSS_SELECTOR, "form.sign-out span").text
        check(header.startswith("sso:") and "(investigator)" in header, f"the header names alice (by her subject at the provider) and her role ({header!r})")
        check(not driver.find_elements(By.LINK_TEXT, "Tokens"), "an investigator is not offered the tokens page")
        shot("11-signed-on")
        driver.find_element(By.CSS_SELECTOR, "form.sign-out button").click()
        # The browser goes by the provider's end-session page: where the provider still knows
        # the person, it asks whether to end its own session too (it must, without an ID token
        # hint); either way it comes back to the console's sign-in.
        provider_origin = provider["issuer"].rsplit("/o", 1)[0]
        try:
            WebDriverWait(driver, 30).until(
                lambda d: d.find_elements(By.CSS_SELECTOR, "input[name=allow]") or d.current_url == short_base + "/console/sign-in")
        except Exception:
            check(False, "signing out goes by the provider's end-session page")
        if driver.find_elements(By.CSS_SELECTOR, "input[name=allow]"):
            driver.find_element(By.CSS_SELECTOR, "input[name=allow]").click()
        at(short_base + "/console/sign-in", "signing out through the provider comes back to sign-in")
        driver.get(short_base + "/console/agents")
        at(short_base + "/console/sign-in?return=%2Fconsole%2Fagents", "after signing out, alice's session is gone")
        # Another person at the same browser: the provider's own session (if any) is forgotten first.
        driver.get(provider_origin + "/accounts/login/")
        driver.delete_all_cookies()
        sso_sign_in("mallory")
        # The callback's URL shows before its page has loaded: wait for the page's words, not
        # reading an element of the page being replaced.
        try:
            WebDriverWait(driver, 30, ignored_exceptions=[NoSuchElementException, StaleElementReferenceException]).until(
                lambda d: "/console/sso/callback" in d.current_url and "none of your groups gives a role" in d.find_element(By.TAG_NAME, "body").text)
            refused = True
        except Exception:
            refused = False
        check(refused, "a person in no group of Dredge's is refused")
        check(driver.get_cookie("dredge_console") is None, "a refused person has no session")
        print(f"console in Chromium: sign-in, agents, filter, narrow window, keyboard, a live pull, its logs, feedback, a live tail, tokens, audit log, a server restart, sign-out, single sign-on passed; screenshots in {out}")
    finally:
        if driver is not None:
            driver.quit()
        for p in processes:
            p.terminate()
        for p in processes:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        if os.environ.get("DREDGE_CONSOLE_KEEP"):
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
