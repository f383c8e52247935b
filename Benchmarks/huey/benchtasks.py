"""Another job system people use: Huey with its SQLite storage, a no-op task."""
import os

from huey import SqliteHuey

huey = SqliteHuey("benchtasks", filename=os.environ.get("HUEY_DB", "huey.sqlite"))


@huey.task()
def noop(index):
    return index
