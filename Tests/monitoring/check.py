#!/usr/bin/env python3
"""The monitoring that docs/monitoring/ ships, checked against a real Prometheus (#56).

    python3 Tests/monitoring/check.py BIN_DIR

Starts a real dredge-server (from BIN_DIR) with a metrics listener of its own, and a real
Prometheus (Debian's `prometheus`; `make deps` installs it) on loopback that scrapes it twice
as an operator would: the admin listener over HTTPS with the deployment's CA and the scrape
token (`credentials_file`), and the metrics' own listener. Then:

- both targets are up, and the exposition passes `promtool check metrics` (Prometheus' lint);
- the alert rules pass `promtool check rules` and their unit tests (`promtool test rules`
  Tests/monitoring/alerts-test.yml), and the running Prometheus evaluates every rule without
  error;
- every query of the Grafana dashboard runs in that Prometheus and returns series, and every
  metric name the dashboard and the rules use is one the server exposes.

Exits non-zero with what failed.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import ssl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DASHBOARD = os.path.join(ROOT, "docs/monitoring/dredge-dashboard.json")
ALERTS = os.path.join(ROOT, "docs/monitoring/dredge-alerts.yml")
ALERT_TESTS = os.path.join(ROOT, "Tests/monitoring/alerts-test.yml")

FAILURES = []


def fail(what: str):
    print(f"FAIL: {what}", flush=True)
    FAILURES.append(what)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, predicate, seconds=120):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except OSError:
            pass
        time.sleep(0.25)
    raise SystemExit(f"gave up waiting for {what}")


def metric_names(expr: str) -> set:
    """The metric names a PromQL expression reads (ours, the process's, and `up`)."""
    return set(re.findall(r"\b((?:dredge|process)_[a-z0-9_]+|up)\b", expr))


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    binaries = sys.argv[1]
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed: Debian's prometheus package (make deps installs it)")
    work = tempfile.mkdtemp(prefix="dredge-monitoring-")
    processes = []
    try:
        # The server: HTTPS admin listener, and the metrics' own listener.
        data = os.path.join(work, "server")
        admin_port, agent_port, own_port, prometheus_port = free_port(), free_port(), free_port(), free_port()
        subprocess.run([os.path.join(binaries, "dredge-server"), "init", "--data", data], check=True, capture_output=True)
        with open(os.path.join(data, "server.json")) as f:
            config = json.load(f)
        config["metrics"] = {"listen": f"127.0.0.1:{own_port}"}
        with open(os.path.join(data, "server.json"), "w") as f:
            json.dump(config, f)
        server_log = open(os.path.join(work, "server.log"), "w")
        server = subprocess.Popen(
            [os.path.join(binaries, "dredge-server"), "run", "--data", data, "--agent-port", str(agent_port), "--admin-port", str(admin_port)],
            stdout=server_log, stderr=server_log)
        processes.append(server)
        token_file = os.path.join(data, "metrics-token")
        wait_for("the server's listeners", lambda: all(socket.create_connection(("127.0.0.1", p), timeout=1).close() is None for p in (admin_port, own_port)))
        wait_for("the scrape token", lambda: os.path.exists(token_file))

        # An error on the admin listener, so its error counter exists as a series.
        context = ssl.create_default_context(cafile=os.path.join(data, "ca.pem"))
        try:
            urllib.request.urlopen(f"https://127.0.0.1:{admin_port}/metrics", timeout=10, context=context)
            fail("GET /metrics without the scrape token was answered")
        except urllib.error.HTTPError as e:
            if e.code != 401:
                fail(f"GET /metrics without the scrape token: {e.code}, not 401")

        # Prometheus' lint on the exposition, as the scrape token reads it.
        request = urllib.request.Request(f"https://127.0.0.1:{admin_port}/metrics", headers={"Authorization": "Bearer " + open(token_file).read().strip()})
        exposition = urllib.request.urlopen(request, timeout=10, context=context).read()
        lint = subprocess.run(["promtool", "check", "metrics"], input=exposition, capture_output=True)
        if lint.returncode != 0 or lint.stdout.strip() or lint.stderr.strip():
            fail(f"promtool check metrics:\n{lint.stdout.decode()}{lint.stderr.decode()}")

        # The rules, on their own.
        for args in (["check", "rules", ALERTS], ["test", "rules", ALERT_TESTS]):
            checked = subprocess.run(["promtool"] + args, capture_output=True, text=True, cwd=os.path.dirname(ALERT_TESTS))
            if checked.returncode != 0:
                fail(f"promtool {' '.join(args[:2])}:\n{checked.stdout}{checked.stderr}")

        # A real Prometheus scraping the server as an operator would.
        prometheus_config = os.path.join(work, "prometheus.yml")
        with open(prometheus_config, "w") as f:
            f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - {ALERTS}
scrape_configs:
  - job_name: dredge
    scheme: https
    tls_config:
      ca_file: {os.path.join(data, "ca.pem")}
    authorization:
      credentials_file: {token_file}
    static_configs:
      - targets: ["127.0.0.1:{admin_port}"]
  - job_name: dredge-own-listener
    static_configs:
      - targets: ["127.0.0.1:{own_port}"]
""")
        prometheus_log = open(os.path.join(work, "prometheus.log"), "w")
        prometheus = subprocess.Popen(
            ["prometheus", f"--config.file={prometheus_config}", f"--storage.tsdb.path={os.path.join(work, 'tsdb')}",
             f"--web.listen-address=127.0.0.1:{prometheus_port}", "--log.level=warn"],
            stdout=prometheus_log, stderr=prometheus_log)
        processes.append(prometheus)
        base = f"http://127.0.0.1:{prometheus_port}"

        def api(path: str, **query):
            url = base + path + ("?" + urllib.parse.urlencode(query) if query else "")
            with urllib.request.urlopen(url, timeout=10) as response:
                answer = json.loads(response.read())
            if answer.get("status") != "success":
                raise RuntimeError(f"{path} {query}: {answer}")
            return answer["data"]

        def targets_up():
            active = api("/api/v1/targets")["activeTargets"]
            return len(active) == 2 and all(t["health"] == "up" for t in active)

        wait_for("both targets up in Prometheus", targets_up)
        # A few scrapes, so that rates have two samples at least.
        wait_for("five scrapes", lambda: float(api("/api/v1/query", query='count_over_time(up{job="dredge"}[1m])')["result"][0]["value"][1]) >= 5)
        for target in api("/api/v1/targets")["activeTargets"]:
            if target["lastError"]:
                fail(f"target {target['scrapeUrl']}: {target['lastError']}")

        exposed = set(api("/api/v1/label/__name__/values"))
        used = set()

        # The dashboard: every query runs and returns series.
        with open(DASHBOARD) as f:
            dashboard = json.load(f)
        queries = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
        if not queries:
            fail("the dashboard has no queries")
        for expr in queries:
            used |= metric_names(expr)
            try:
                result = api("/api/v1/query", query=expr)["result"]
                if not result:
                    fail(f"dashboard query returns no series: {expr}")
            except Exception as e:  # noqa: BLE001 - reported, and the check goes on
                fail(f"dashboard query fails: {expr}: {e}")

        # The rules: loaded, every one evaluated without error.
        wait_for("the rules evaluated", lambda: all(r.get("lastEvaluation", "").startswith("20") for g in api("/api/v1/rules")["groups"] for r in g["rules"]))
        rules = [r for g in api("/api/v1/rules")["groups"] for r in g["rules"]]
        with open(ALERTS) as f:
            declared = re.findall(r"^\s*- alert: (\w+)", f.read(), re.MULTILINE)
        if sorted(r["name"] for r in rules) != sorted(declared):
            fail(f"Prometheus loaded {sorted(r['name'] for r in rules)}, the file declares {sorted(declared)}")
        for rule in rules:
            used |= metric_names(rule["query"])
            if rule["health"] != "ok" or rule.get("lastError"):
                fail(f"rule {rule['name']}: {rule['health']} {rule.get('lastError', '')}")
        # A fresh server with no agent, no failure: nothing fires.
        firing = [a["labels"]["alertname"] for a in api("/api/v1/alerts")["alerts"] if a["state"] == "firing"]
        if firing:
            fail(f"alerts firing on a healthy idle server: {firing}")

        for name in sorted(used - exposed):
            fail(f"the dashboard or the rules use {name}, which the server does not expose")
        print(f"monitoring: {len(queries)} dashboard queries, {len(rules)} alert rules, {len(used)} metric names, all against a real Prometheus")
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
        if FAILURES:
            print(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if FAILURES:
        raise SystemExit(f"{len(FAILURES)} monitoring check(s) failed")


if __name__ == "__main__":
    main()
