#!/usr/bin/env python3
"""The model benchmark's driver (scripts/bench-models.sh starts the system).

1. ceiling: the provider fixture alone, asked for Gemini edits CONCURRENCY at once (the request
   the worker's adapter sends), for IMAGES requests: the rate the provider servers allow.
2. images: IMAGES jobs of the Gemini-priced model through the gateway, from creation to the last
   completed: jobs per second. Meanwhile the Gemini requests in flight at the fixture are
   sampled every 20 ms; their mean per half second goes to stderr (how full the 16 places are).
3. videos: VIDEOS jobs of the fal video model created at once; sampled every 0.5 s until all
   completed: the most generations in flight at the provider, and the jobs service's count of
   worker slots held at that moment.

Prints `ceiling=R images_per_s=X videos_in_flight=Z slots_held=W`.

usage: models-bench.py GATEWAY_URL FIXTURE_URL IMAGES VIDEOS CONCURRENCY
"""
import base64
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid

gateway, fixture, images, videos, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
with open(os.path.join(os.path.dirname(__file__), "..", "Tests", "Fixtures", "images", "photo.jpg"), "rb") as f:
    photo = f.read()
local = threading.local()


def call(base, method, path, body=None, headers=None):
    netloc = urllib.parse.urlsplit(base).netloc
    pool = getattr(local, "pool", None)
    if pool is None:
        pool = local.pool = {}
    for attempt in range(3):
        connection = pool.get(netloc) or http.client.HTTPConnection(netloc, timeout=120)
        pool[netloc] = connection
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.read()
        except (http.client.HTTPException, OSError):
            connection.close()
            pool.pop(netloc, None)
            if attempt == 2:
                raise


def parallel(count, work):
    """Runs work(i) for i in range(count), CONCURRENCY threads; returns the seconds taken."""
    lock = threading.Lock()
    state = {"next": 0}
    errors = []

    def loop():
        while True:
            with lock:
                index = state["next"]
                state["next"] += 1
            if index >= count:
                return
            try:
                work(index)
            except Exception as error:  # noqa: BLE001 - reported below
                errors.append(repr(error))

    started = time.monotonic()
    threads = [threading.Thread(target=loop) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        sys.exit(f"{len(errors)} failures, first: {errors[0]}")
    return time.monotonic() - started


# 1. The providers' ceiling: the fixture alone.
gemini_body = json.dumps({
    "contents": [{"parts": [{"text": "make it brighter"}, {"inline_data": {"mime_type": "image/jpeg", "data": base64.b64encode(photo).decode()}}]}],
    "generationConfig": {"responseModalities": ["TEXT", "IMAGE"]},
})
gemini_headers = {"x-goog-api-key": os.environ.get("FIXTURE_GEMINI_KEY", "test-gemini-key"), "Content-Type": "application/json"}


def ask_gemini(_):
    status, _ = call(fixture, "POST", "/v1beta/models/gemini-2.5-flash-image:generateContent", gemini_body, gemini_headers)
    if status != 200:
        raise RuntimeError(f"fixture answered {status}")


ceiling = images / parallel(images, ask_gemini)

# Users: guests, each with an uploaded photo.
users = []
for _ in range(32):
    device = str(uuid.uuid4())
    headers = {"X-Device-ID": device, "Content-Type": "application/json"}
    status, body = call(gateway, "POST", "/api/v1/uploads/presigned", json.dumps({"filename": "p.jpg", "contentType": "image/jpeg"}), headers)
    answer = json.loads(body)
    put = urllib.parse.urlsplit(answer["uploadUrl"])
    status, _ = call(gateway, "PUT", put.path + "?" + put.query, photo, {"Content-Type": "image/jpeg"})
    assert status in (200, 201), status
    users.append((headers, answer["imageKey"]))


def metrics():
    _, body = call(gateway, "GET", "/metrics")
    return body.decode()


def sample(text, name, labels=""):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and labels in line and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def completed(effect):
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics().splitlines()
               if line.startswith("jobs_results_total") and f'effect="{effect}"' in line and 'state="completed"' in line)


def create(effect, index):
    headers, key = users[index % len(users)]
    status, body = call(gateway, "POST", "/api/v1/jobs", json.dumps({"imageKey": key, "effectId": effect, "prompt": f"edit {index}"}), headers)
    if status != 202:
        raise RuntimeError(f"create answered {status}: {body[:200]}")


def wait_completed(effect, count, limit):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        done = completed(effect)
        if done >= count:
            return time.monotonic()
        # Each look is a scrape of every process: not too often, or it is what is measured. But
        # the end is the time of the look that sees it, so near the end the looks come every
        # 50 ms (a 0.5 s pace alone would add up to half a second to a 4 s run: 10% of its rate).
        time.sleep(0.05 if done >= 0.95 * count else 0.5)
    sys.exit(f"only {completed(effect)} of {count} {effect} jobs completed in {limit} s")


# 2. Images through the whole system. With BENCH_PERF=DIR, a system-wide perf profile (call
# graphs) of the first 8 s of it goes to DIR/images.data.
started = time.monotonic()
profiler = None
if os.environ.get("BENCH_PERF"):
    os.makedirs(os.environ["BENCH_PERF"], exist_ok=True)
    profiler = subprocess.Popen(["perf", "record", "-q", "-a", "-g", "-F", "999", "-o", os.path.join(os.environ["BENCH_PERF"], "images.data"),
                                 "--", "sleep", "8"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
in_flight = []  # (seconds since the start, Gemini requests in flight at the fixture)
sampling = threading.Event()


def sample_in_flight():
    while not sampling.is_set():
        _, body = call(fixture, "GET", "/_fixture/stats")
        in_flight.append((time.monotonic() - started, json.loads(body)["inFlight"].get("gemini", 0)))
        time.sleep(0.02)


in_flight_thread = threading.Thread(target=sample_in_flight)
in_flight_thread.start()
created = parallel(images, lambda index: create("banana", index))
finished = wait_completed("banana", images, 600)
images_per_s = images / (finished - started)
sampling.set()
in_flight_thread.join()
buckets = {}
for at, count in in_flight:
    buckets.setdefault(int(at / 0.5), []).append(count)
print("(diagnostic) Gemini requests in flight at the fixture, mean per half second: "
      + " ".join("%.1f" % (sum(v) / len(v)) for _, v in sorted(buckets.items())), file=sys.stderr)
if profiler:
    profiler.wait()
print(f"(diagnostic) {images} image jobs created in {created:.1f} s, {images / images_per_s:.1f} s to the last completion", file=sys.stderr)
text = metrics()
for name in ["worker_provider_request_seconds", "worker_job_duration_seconds", "jobs_run_duration_seconds", "jobs_wait_before_assignment_seconds"]:
    total, count = sample(text, name + "_sum"), sample(text, name + "_count")
    if count:
        print(f"(diagnostic) {name}: mean {1000 * total / count:.1f} ms over {count:.0f}", file=sys.stderr)
for line in text.splitlines():
    if line.startswith("http_server_request_duration") and ("_sum" in line or "_count" in line) and "/files" in line:
        print("(diagnostic) " + line, file=sys.stderr)

# 3. Videos: all created at once, sampled until done.
peak = {"in_flight": 0, "slots": 0}
done = threading.Event()


def sampler():
    while not done.is_set():
        _, body = call(fixture, "GET", "/_fixture/stats")
        waiting = json.loads(body)["falRequestsWaiting"]
        text = metrics()
        slots = sample(text, "jobs_worker_slots_held")
        if waiting > peak["in_flight"]:
            peak["in_flight"], peak["slots"] = waiting, int(slots)
        time.sleep(0.5)


thread = threading.Thread(target=sampler)
thread.start()
parallel(videos, lambda index: create("veo", index))
wait_completed("veo", videos, 900)
done.set()
thread.join()
print(f"ceiling={ceiling:.1f} images_per_s={images_per_s:.1f} videos_in_flight={peak['in_flight']} slots_held={peak['slots']}")
