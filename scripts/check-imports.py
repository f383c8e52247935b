#!/usr/bin/env python3
"""Fails when a target imports a module of this package that its dependencies do not name.

SwiftPM rebuilds a target when a module it names changes, not one it only reaches through
another. A release build compiles other modules' class sizes into the code that creates their
objects, so a module left unnamed can keep a stale size after an incremental build: history's and
jobs' main.swift allocated BusClient at its old size after a stored property was added, and the
services crashed with "double free or corruption" (Package.swift, above the history target).
"""
import glob
import json
import os
import re
import subprocess
import sys

os.chdir(os.path.join(os.path.dirname(__file__), ".."))
# The manifest evaluated in the one environment scripts/swift-build.sh builds in.
keep = {k: v for k, v in os.environ.items() if k in ("HOME", "PATH", "TMPDIR") or k.startswith("SWIFT")}
package = json.loads(subprocess.run(["swift", "package", "dump-package"], env=keep, check=True, capture_output=True, text=True).stdout)
targets = {target["name"]: target for target in package["targets"]}
import_line = re.compile(r"^\s*(?:@[\w]+(?:\([^)]*\))?\s+)*import\s+(?:(?:struct|class|enum|protocol|func|var|let|typealias)\s+)?(\w+)")
problems = []
for name, target in sorted(targets.items()):
    if target["type"] not in ("regular", "executable", "test"):
        continue
    path = target.get("path") or os.path.join("Tests" if target["type"] == "test" else "Sources", name)
    named = {value[0] for dependency in target["dependencies"] for value in dependency.values()}
    imported = set()
    for source in glob.glob(os.path.join(path, "**", "*.swift"), recursive=True):
        with open(source, encoding="utf-8") as file:
            imported.update(match.group(1) for match in map(import_line.match, file) if match)
    missing = sorted((imported & targets.keys()) - named - {name})
    if missing:
        problems.append(f"{name} ({path}) imports {', '.join(missing)} without naming it in its dependencies")
if problems:
    print("Package.swift: " + "\n  ".join(["targets import modules they do not name:"] + problems), file=sys.stderr)
    sys.exit(1)
print(f"imports named: {sum(1 for t in targets.values() if t['type'] in ('regular', 'executable', 'test'))} targets")
