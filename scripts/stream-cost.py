#!/usr/bin/env python3
"""What open job event streams cost: starts quota, history, jobs and the gateway from BIN (no
workers, so every job stays queued and its stream stays open), opens STREAMS streams on as many
distinct jobs (the worst case for sharing: one job, one stream), and prints the CPU the jobs
service and the gateway spend while they are open, and the gateway's open descriptors before,
with the streams open, and after the clients dropped them.

    scripts/stream-cost.py BIN_DIR [STREAMS]     (make stream-cost runs it on a release build)
"""
import json, os, resource, signal, socket, subprocess, sys, tempfile, time, urllib.request, uuid

BIN = sys.argv[1]
STREAMS = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
SECONDS = float(os.environ.get("MEASURE_SECONDS", "10"))
FIXTURE = os.path.join(os.path.dirname(__file__), "..", "Tests", "Fixtures", "images", "photo.jpg")


def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def descriptors(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def call(method, url, headers=None, body=None):
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"{}")


resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
work = tempfile.mkdtemp()
gateway_port = port()
env = dict(os.environ, DATA_DIR=work, LOG_LEVEL="warning", GATEWAY_PORT=str(gateway_port),
           JWT_SECRET="stream-cost-jwt-secret-0123456789abcdef", ADMIN_TOKEN="stream-cost",
           URL_SIGNING_SECRET="stream-cost", PUBLIC_BASE_URL=f"http://127.0.0.1:{gateway_port}",
           SSE_MAX_PER_USER=str(STREAMS), SSE_MAX_STREAMS=str(STREAMS + 10), JOBS_WORKER_BIND=f"tcp://127.0.0.1:{port()}",
           QUOTA_PLANS='{"free": {"daily": 100000, "monthly": 100000}, "pro": {"daily": 100000, "isPro": true}}')
for name in ("quota", "history", "jobs"):
    endpoint = f"tcp://127.0.0.1:{port()}"
    env[f"{name.upper()}_ENDPOINT"] = endpoint
    env[f"{name.upper()}_BIND"] = endpoint
processes = {name: subprocess.Popen([os.path.join(BIN, name)], env=env) for name in ("quota", "history", "jobs", "gateway")}
try:
    base = f"http://127.0.0.1:{gateway_port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(base + "/readyz", timeout=1); break
        except Exception:
            time.sleep(0.2)
    device = str(uuid.uuid4())
    guest = {"X-Device-Id": device}
    presigned = call("POST", base + "/api/v1/uploads/presigned", dict(guest, **{"Content-Type": "application/json"}),
                     json.dumps({"filename": "a.jpg", "contentType": "image/jpeg"}).encode())
    call("PUT", presigned["uploadUrl"], {"Content-Type": "image/jpeg"}, open(FIXTURE, "rb").read())
    jobs = [call("POST", base + "/api/v1/jobs", dict(guest, **{"Content-Type": "application/json"}),
                 json.dumps({"imageKey": presigned["imageKey"], "effectId": "copy"}).encode())["jobId"] for _ in range(STREAMS)]
    gateway, jobs_pid = processes["gateway"].pid, processes["jobs"].pid
    before = descriptors(gateway)
    streams = []
    for job in jobs:
        s = socket.create_connection(("127.0.0.1", gateway_port))
        s.sendall(f"GET /api/v1/jobs/{job}/events HTTP/1.1\r\nHost: g\r\nX-Device-Id: {device}\r\n\r\n".encode())
        received = b""
        while b"\n\n" not in received.split(b"\r\n\r\n", 1)[-1]:
            chunk = s.recv(65536)
            if not chunk: break
            received += chunk
        assert received.startswith(b"HTTP/1.1 200"), received[:80]
        streams.append(s)
    time.sleep(1)  # let the opening settle before measuring
    with_streams = descriptors(gateway)
    jobs_cpu, gateway_cpu, start = cpu_seconds(jobs_pid), cpu_seconds(gateway), time.monotonic()
    time.sleep(SECONDS)
    elapsed = time.monotonic() - start
    jobs_share = (cpu_seconds(jobs_pid) - jobs_cpu) / elapsed * 100
    gateway_share = (cpu_seconds(gateway) - gateway_cpu) / elapsed * 100
    for s in streams: s.close()
    dropped = time.monotonic()
    while descriptors(gateway) > before and time.monotonic() - dropped < 60: time.sleep(0.05)
    after, freed_in = descriptors(gateway), time.monotonic() - dropped
    print(f"{STREAMS} open streams on {STREAMS} jobs: jobs service {jobs_share:.1f}% CPU, gateway {gateway_share:.1f}% CPU")
    print(f"gateway descriptors: {before} before, {with_streams} with the streams open, {after} {freed_in:.1f} s after the clients dropped them")
finally:
    for process in processes.values(): process.send_signal(signal.SIGTERM)
    for process in processes.values(): process.wait(timeout=10)
    subprocess.run(["rm", "-rf", work])
