"""The job system people use instead: Celery with Redis, a no-op task, late acknowledgement."""
import os

from celery import Celery

broker = os.environ.get("CELERY_BROKER", "redis://127.0.0.1:6379/0")
app = Celery("benchtasks", broker=broker, backend=broker)
app.conf.task_acks_late = True
app.conf.worker_prefetch_multiplier = 1
app.conf.result_expires = 600


@app.task
def noop(index):
    return index
