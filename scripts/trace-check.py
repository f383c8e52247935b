#!/usr/bin/env python3
"""The checks of scripts/trace-check.sh, against a stack that exports its spans to
scripts/otlp-receiver.py (which writes them to SPANS, one JSON object a line).

usage: trace-check.py GATEWAY_URL SPANS PHOTO GATEWAY_LOG
"""
import json
import os
import re
import secrets
import sys
import time
import urllib.parse
import urllib.request
import uuid

gateway, spans_file, photo, gateway_log = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
SERVER, CLIENT = 2, 3
device = str(uuid.uuid4())


def request(method, path, body=None, headers=None):
    url = path if path.startswith("http") else gateway + path
    data = body.encode() if isinstance(body, str) else body
    req = urllib.request.Request(url, data=data, method=method, headers={"X-Device-Id": device, **(headers or {})})
    with urllib.request.urlopen(req, timeout=10) as response:
        text = response.read()
        return response.status, (json.loads(text) if text and response.headers.get_content_type().endswith("json") else text)


def spans():
    if not os.path.exists(spans_file):
        return []
    with open(spans_file) as f:
        return [json.loads(line) for line in f if line.strip()]


def wait(what, condition, seconds=30):
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        result = condition()
        if result:
            print(f"  ok: {what}")
            return result
        time.sleep(0.3)
    print("the spans received:", file=sys.stderr)
    for span in spans():
        print(f"  {span.get('trace_id', '')[:8]} {span.get('service')} {span.get('name')} kind={span.get('kind')} "
              f"span={span.get('span_id')} parent={span.get('parent_span_id')} {span.get('invalid', '')}", file=sys.stderr)
    sys.exit(f"FAILED: {what}")


# The app's edit: upload, then create with the app's own trace context.
_, presigned = request("POST", "/api/v1/uploads/presigned", json.dumps({"filename": "p.jpg", "contentType": "image/jpeg"}), {"Content-Type": "application/json"})
put = urllib.parse.urlsplit(presigned["uploadUrl"])
with open(photo, "rb") as f:
    request("PUT", put.path + "?" + put.query, f.read(), {"Content-Type": "image/jpeg"})
trace_id, app_span = secrets.token_hex(16), secrets.token_hex(8)
status, created = request("POST", "/api/v1/jobs", json.dumps({"imageKey": presigned["imageKey"], "effectId": "grayscale"}),
                          {"Content-Type": "application/json", "traceparent": f"00-{trace_id}-{app_span}-01"})
assert status == 202, status
job = created["jobId"]
wait("the edit completed", lambda: request("GET", f"/api/v1/jobs/{job}/status")[1]["status"] == "completed")


def trace():
    return [span for span in spans() if span.get("trace_id") == trace_id]


def complete():
    found = trace()
    services = {span["service"] for span in found}
    return found if {"gateway", "quota", "jobs", "worker"} <= services else None


found = wait("the spans of the gateway, quota, jobs and the worker arrived under the app's trace id", complete)
time.sleep(1)  # the batches still on their way
found = trace()
invalid = [span for span in spans() if "invalid" in span]
assert not invalid, f"the receiver refused exports: {invalid}"
by_id = {span["span_id"]: span for span in found}
roots = [span for span in found if span["parent_span_id"] == app_span]
assert len(roots) == 1 and roots[0]["service"] == "gateway" and roots[0]["kind"] == SERVER, f"the app's span is continued by one gateway server span: {roots}"
print(f"  ok: the app's traceparent is continued by the gateway's span '{roots[0]['name']}'")
orphans = [span for span in found if span["parent_span_id"] != app_span and span["parent_span_id"] not in by_id]
assert not orphans, f"spans whose parent is not in the trace: {orphans}"
print(f"  ok: every one of the {len(found)} spans has its parent in the trace")
calls = [span for span in found if span["kind"] == CLIENT and span["attributes"].get("rpc.system") == "photoedit-bus"]
for call in calls:
    handlers = [span for span in found if span["parent_span_id"] == call["span_id"] and span["kind"] == SERVER and span["name"] == call["name"]]
    assert len(handlers) == 1 and handlers[0]["service"] != call["service"], f"the bus call {call['name']} from {call['service']} has one handler span elsewhere: {handlers}"
print(f"  ok: each of the {len(calls)} bus calls is the parent of its handler's span ({', '.join(sorted({c['name'] for c in calls}))})")
dispatch = [span for span in found if span["service"] == "jobs" and span["name"] == "jobs.dispatch"]
assert len(dispatch) == 1 and dispatch[0]["attributes"].get("photoedit.job.id") == job, f"one dispatch span for the job: {dispatch}"
runs = [span for span in found if span["service"] == "worker" and span["name"] == "worker.run"]
assert len(runs) == 1 and runs[0]["parent_span_id"] == dispatch[0]["span_id"], f"the worker's run is the dispatch's child: {runs}"
assert runs[0]["attributes"].get("photoedit.job.id") == job
print("  ok: jobs' dispatch span is the parent of the worker's run, both naming the job")
calls = [span for span in found if span["service"] == "worker" and span["parent_span_id"] == runs[0]["span_id"]]
assert {span["name"] for span in calls} >= {"GET", "PUT"}, f"the worker's input read and output writes are the run's children: {calls}"
stored = [span for span in found if span["service"] == "gateway" and span["parent_span_id"] in {c["span_id"] for c in calls}]
assert len(stored) == len(calls), f"each of the worker's transfers is served by a gateway span under it: {stored}"
print(f"  ok: the worker's {len(calls)} transfers are the run's children, and the gateway's file routes theirs")
# Each write the request made joined a group commit whose span links to the request's handler:
# quota's batch of decisions written to its ledger's log, jobs' SQLite transaction.
def commits_linking(handler, name):
    return [span for span in spans() if span["name"] == name and {"trace_id": trace_id, "span_id": handler["span_id"]} in span["links"]]


for service, method, name in [("quota", "quota.reserve", "quota.ledger-commit"), ("jobs", "jobs.create", "sqlite.group-commit")]:
    handler = next(span for span in found if span["service"] == service and span["name"] == method and span["kind"] == SERVER)
    commits = wait(f"{service}'s group commit of {method} links to its handler's span",
                   lambda handler=handler, name=name: commits_linking(handler, name), seconds=10)
    assert all(commit["service"] == service for commit in commits)

# History's deliveries of the job's events are linked to the trace the job was created in.
created = next(span for span in found if span["service"] == "jobs" and span["name"] == "jobs.create" and span["kind"] == SERVER)
wait("jobs' deliveries of the job's events to history link to the job's trace", lambda: [
    span for span in spans() if span["name"] == "jobs.outbox.history" and {"trace_id": trace_id, "span_id": created["span_id"]} in span["links"]
], seconds=10)

# No signature of a presigned URL in any span (the gateway's own show them redacted).
signed = [span for span in spans() if re.search(r"sig=(?!REDACTED)|X-Amz-Signature=(?!REDACTED)|X-Amz-Credential=(?!REDACTED)", json.dumps(span.get("attributes", {})))]
assert not signed, f"signatures in span attributes: {signed}"
print("  ok: no span carries a URL's signature")

# The gateway's log lines of the request (JSON, debug) carry its trace id and a span of it.
with open(gateway_log) as f:
    lines = [json.loads(line) for line in f if line.startswith("{")]
traced = [line for line in lines if line.get("trace_id") == trace_id]
assert traced and all(line.get("span_id") in by_id for line in traced), f"log lines of the trace: {traced}"
print(f"  ok: {len(traced)} of the gateway's log lines carry the trace id and one of its spans")

# A request without a traceparent starts a trace of its own.
before = {span["trace_id"] for span in spans()}
request("GET", "/api/v1/users/me")
fresh = wait("a request without traceparent starts a new trace", lambda: [
    span for span in spans() if span["trace_id"] not in before and span["service"] == "gateway" and span["kind"] == SERVER and not span["parent_span_id"]
])
assert fresh[0]["trace_id"] != trace_id
