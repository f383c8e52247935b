"""Sends COUNT no-op tasks and waits for every result: prints celery_tasks_per_s=X."""
import sys
import time

from benchtasks import noop

count = int(sys.argv[1])
noop.delay(-1).get(timeout=60)  # warm up: the workers are up and connected
start = time.monotonic()
results = [noop.delay(index) for index in range(count)]
for result in results:
    result.get(timeout=300)
elapsed = time.monotonic() - start
print(f"celery_tasks_per_s={count / elapsed:.1f} seconds={elapsed:.2f}")
