#!/usr/bin/env python3
"""Uploads through the app's flow, as the app makes them: `POST /api/v1/uploads/presigned` to the
gateway, then the `PUT` of 2 MB to the URL it answers with the headers it gives (the gateway's own
route with the folder store, the bucket with the S3 store). COUNT uploads, CONCURRENCY at once,
each as a new guest. Prints one line `uploads=N seconds=S uploads_per_s=X gateway_cpu_ms=C
gateway_bytes=B` where C is the gateway's CPU time per upload (from /proc/PID/stat) and B the bytes
that crossed the gateway per upload (request and answer, heads and bodies, counted by this client
for every request sent to the gateway's address).

usage: blobs-bench.py GATEWAY_URL GATEWAY_PID COUNT CONCURRENCY
"""
import http.client
import json
import os
import sys
import threading
import time
import urllib.parse
import uuid

gateway, pid, count, concurrency = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
gateway_netloc = urllib.parse.urlsplit(gateway).netloc
ticks = os.sysconf("SC_CLK_TCK")
# A JPEG's first bytes, then filler: the gateway's PUT checks the type and the header's size.
with open(os.path.join(os.path.dirname(__file__), "..", "Tests", "Fixtures", "images", "photo.jpg"), "rb") as f:
    photo = f.read()
body = (photo + bytes(2 * 1024 * 1024))[: 2 * 1024 * 1024]


def cpu_ms():
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / ticks


lock = threading.Lock()
state = {"next": 0, "done": 0, "failed": 0, "gateway_bytes": 0, "errors": []}
local = threading.local()


def connection(netloc):
    pool = getattr(local, "pool", None)
    if pool is None:
        pool = local.pool = {}
    if netloc not in pool:
        pool[netloc] = http.client.HTTPConnection(netloc, timeout=60)
    return pool[netloc]


def request(method, url, headers, payload):
    parts = urllib.parse.urlsplit(url)
    path = parts.path + ("?" + parts.query if parts.query else "")
    for attempt in range(2):
        conn = connection(parts.netloc)
        try:
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            data = response.read()
            break
        except (http.client.HTTPException, OSError):
            conn.close()
            local.pool.pop(parts.netloc, None)
            if attempt == 1:
                raise
    if parts.netloc == gateway_netloc:
        head_out = len(f"{method} {path} HTTP/1.1\r\n") + sum(len(k) + len(str(v)) + 4 for k, v in headers.items()) + 2
        head_in = sum(len(k) + len(v) + 4 for k, v in response.getheaders()) + 17
        with lock:
            state["gateway_bytes"] += head_out + len(payload or b"") + head_in + len(data)
    return response.status, data


def one():
    device = str(uuid.uuid4())
    status, data = request("POST", gateway + "/api/v1/uploads/presigned",
                           {"X-Device-Id": device, "Content-Type": "application/json"},
                           json.dumps({"filename": "photo.jpg", "contentType": "image/jpeg"}).encode())
    if status != 200:
        return f"presign answered {status}: {data[:200]!r}"
    answer = json.loads(data)
    headers = dict(answer.get("headers") or {})
    headers["Content-Length"] = str(len(body))
    status, data = request("PUT", answer["uploadUrl"], headers, body)
    if status not in (200, 201):
        return f"PUT answered {status}: {data[:200]!r}"
    return None


def worker():
    while True:
        with lock:
            if state["next"] >= count:
                return
            state["next"] += 1
        try:
            error = one()
        except Exception as exception:  # a failed upload is counted, not fatal
            error = repr(exception)
        with lock:
            if error:
                state["failed"] += 1
                if len(state["errors"]) < 3:
                    state["errors"].append(error)
            else:
                state["done"] += 1


cpu_before, start = cpu_ms(), time.monotonic()
threads = [threading.Thread(target=worker) for _ in range(concurrency)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
seconds, cpu = time.monotonic() - start, cpu_ms() - cpu_before
done = max(1, state["done"])
for error in state["errors"]:
    print("error:", error, file=sys.stderr)
print(f"uploads={state['done']} failed={state['failed']} seconds={seconds:.2f} uploads_per_s={state['done'] / seconds:.1f} "
      f"gateway_cpu_ms={cpu / done:.3f} gateway_bytes={state['gateway_bytes'] / done:.0f}")
