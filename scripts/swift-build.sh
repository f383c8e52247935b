#!/usr/bin/env bash
# `swift build` in one fixed environment, whoever calls it.
#
# SwiftPM evaluates the packages' manifests again whenever its environment differs from the last
# build's (STORE=postgres, BLOB_STORE=s3, make's MAKEFLAGS, a test's variables), and the new
# evaluation made it compile Hummingbird, HummingbirdCore or SwiftProtobuf again: 30 to 100 s
# for each stack that make test started, with nothing changed. Seen with Swift 6.3.1: the same
# `swift build --build-tests` took 51 s with FOO=1 set and 51 s again without it, and 1 s under
# `env -i` whatever the caller's variables. So every build of the project's scripts and Makefile
# goes through here, with only HOME, PATH, TMPDIR and the SWIFT* variables passed on.
set -euo pipefail
keep=(HOME="$HOME" PATH="$PATH")
[ -n "${TMPDIR:-}" ] && keep+=(TMPDIR="$TMPDIR")
while IFS='=' read -r name value; do
  case "$name" in SWIFT*) keep+=("$name=$value") ;; esac
done < <(env)
exec env -i "${keep[@]}" swift build "$@"
