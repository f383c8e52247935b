"""Sends COUNT no-op tasks to Huey and waits for every result: prints huey_tasks_per_s=X."""
import sys
import time

from benchtasks import noop

count = int(sys.argv[1])
noop(-1).get(blocking=True, timeout=60)  # warm up: the consumer is up
start = time.monotonic()
results = [noop(index) for index in range(count)]
for result in results:
    result.get(blocking=True, timeout=300)
elapsed = time.monotonic() - start
print(f"huey_tasks_per_s={count / elapsed:.1f} seconds={elapsed:.2f}")
