#!/usr/bin/env python3
"""The live part of scripts/prometheus-check.sh: asks a Prometheus that scrapes a fresh stack,
through its HTTP API, what an operator relies on. Each condition is waited for with a deadline
(Prometheus needs two scrapes for a rate, the worker reports every 5 s); the first one not met
by its deadline fails the run, saying which.

usage: prometheus-check.py PROMETHEUS_URL DASHBOARD_JSON
"""
import json
import sys
import time
import urllib.parse
import urllib.request

base, dashboard_file = sys.argv[1], sys.argv[2]


def api(path, **params):
    url = f"{base}{path}?{urllib.parse.urlencode(params)}" if params else f"{base}{path}"
    with urllib.request.urlopen(url, timeout=5) as response:
        answer = json.load(response)
    if answer.get("status") != "success":
        raise RuntimeError(f"{path}: {answer}")
    return answer["data"]


def query(expr):
    return api("/api/v1/query", query=expr)["result"]


def wait(what, condition, seconds=45):
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        try:
            result = condition()
            if result:
                print(f"  ok: {what}")
                return result
            last = "not yet"
        except Exception as error:  # noqa: BLE001 - Prometheus not up yet, reported on timeout
            last = repr(error)
        time.sleep(0.5)
    sys.exit(f"FAILED: {what} (last: {last})")


def scraped():
    if any(s["value"][1] == "1" for s in query('up{job="photoedit"}')):
        return True
    # Not yet: why, as Prometheus saw the last scrape (what the failure prints).
    targets = api("/api/v1/targets")["activeTargets"]
    raise RuntimeError("; ".join(f"{t['scrapeUrl']}: {t['health']} {t.get('lastError', '')} after {t.get('lastScrapeDuration')} s"
                                 for t in targets) or "no target yet")


wait("Prometheus is ready and scrapes the gateway", scraped)


def services_of(expr):
    return {s["metric"].get("service") for s in query(expr)}


wait("the gateway's series", lambda: "gateway" in services_of("http_server_request_duration_seconds_count"))
wait("quota's, history's and jobs' series", lambda: {"quota", "history", "jobs"} <= services_of("bus_requests_total"))
wait("the worker's series (sent to jobs every 5 s)", lambda: "worker" in services_of("worker_jobs_in_progress"))


def zero_rate(expr):
    result = query(expr)
    return bool(result) and all(float(s["value"][1]) == 0 for s in result)


for expr in [
    'rate(bus_requests_total{service="quota", method="quota.reserve", code="ok"}[1m])',
    'rate(quota_decisions_total{decision="denied"}[1m])',
    'rate(jobs_results_total{state="failed"}[1m])',
    'rate(http_server_request_errors_total{http_route="/api/v1/jobs"}[1m])',
    'rate(history_events_received_total[1m])',
]:
    wait(f"{expr} is 0 right after the start, not absent", lambda expr=expr: zero_rate(expr))


def rules_ok():
    rules = [rule for group in api("/api/v1/rules")["groups"] for rule in group["rules"]]
    bad = [f"{rule['name']}: {rule.get('health')} {rule.get('lastError', '')}" for rule in rules if rule.get("health") != "ok"]
    if bad:
        raise RuntimeError("; ".join(bad))
    return len(rules)


count = wait("every shipped rule loaded and evaluates without error", rules_ok)
print(f"  ({count} rules)")

with open(dashboard_file) as f:
    dashboard = json.load(f)
exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
for expr in exprs:
    wait(f"dashboard query returns data: {expr}", lambda expr=expr: bool(query(expr)))
print(f"  ({len(exprs)} dashboard queries)")
