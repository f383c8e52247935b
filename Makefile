# Every target installs the system packages it needs first (scripts/install-deps.sh).
SHELL := /bin/bash
CONFIG ?= debug

.PHONY: deps build run test console-check hosts-chaos chaos-postgres conformance generate loadtest bench-gateway bench-bus bench-quota bench-jobs bench-history bench-blobs bench-models stream-cost clean

deps:
	@scripts/install-deps.sh

build: deps
	scripts/swift-build.sh -c $(CONFIG)

## Runs quota, history, jobs and the gateway on localhost, data under $(DATA_DIR) (default .data).
run: deps
	@CONFIG=$(CONFIG) scripts/run.sh

## The store and rule suites (SQLite and PostgreSQL in this process): a part of their own. Beside
## the system tests, whose in-process gateways and clients keep the shared event loops busy, their
## PostgreSQL connections waited past the tests' limits (see docs/architecture.md, "Tests").
STORE_TESTS := ^(QuotaTests|JobsTests|HistoryTests)\.|\.PostgresPoolTests/
## The suites that start many processes (a PostgreSQL of their own, too), kill them with SIGKILL or
## open thousands of sockets: they run after the rest, one at a time (`--no-parallel`), not beside
## every other suite.
HEAVY_TESTS := SlowClientsTests|QuotaProcessTests|BusProcessTests|BusReplicaTests|JobsReplicaTests|QuotaReplicaTests|HistoryReplicaTests|PostgresConnectionLimitTests

## The whole system over nine hosts (network and mount namespaces, scripts/hosts.sh): hosts crashed
## and partitioned under a steady load, every invariant checked after each fault (root; about 8.5
## minutes; CI runs it within `make test`, beside the checks on live stacks: HOSTS_CHAOS=1).
## docs/operating.md, "Faults".
hosts-chaos: deps
	scripts/hosts-chaos.sh

## Checks that each target names every module of ours it imports (scripts/check-imports.py: an
## unnamed one can go stale in incremental release builds), builds everything (services,
## fixtures, tests), runs the bus tests (alone: they time requests
## in milliseconds), then the rest of the suite beside a RADOS Gateway of its own (scripts/with-s3.sh:
## Ceph's S3 server from Debian, in a temporary folder on a free port, stopped after) and a
## throwaway PostgreSQL of its own (scripts/with-postgres.sh: Debian's PostgreSQL 15, likewise,
## without flushes): STORE_TESTS in parallel, then the other suites in parallel, then HEAVY_TESTS
## one at a time. Each part is
## bounded (scripts/swift-test.sh: past its minutes the run is stopped and the tests still running
## are named; every suite also has its own time limit). Then the checks on live stacks
## (scripts/test-checks.sh, in two lanes at once): the chaos checks (30 s of loadtest under chaos,
## failing on any broken invariant: on SQLite, with BLOB_STORE=s3 and the RADOS Gateway killed too,
## and on PostgreSQL with two replicas of each service killed, both jobs replicas first) beside the
## contract conformance run (schemathesis against openapi.yaml), the app's flows as the seeds write
## them (scripts/seed-contract.sh, on each store), the operators' console in Chromium driven by
## Selenium, the alert rules' unit tests and a real Prometheus scraping a stack with them, one
## edit's trace through every process to an OTLP receiver, and Ctrl-C (SIGINT to the process group)
## stopping each stack within 10 s, leaving nothing running, once with SIGKILL 300 ms after the
## SIGINT. Last, alone: PostgreSQL itself killed and restarted under load, every request answered
## before its 5 s deadline (503 while it is down, no 504; the client's max under 6 s, a margin for
## a loaded machine) and every invariant kept. With HOSTS_CHAOS=1 (root; CI), `make hosts-chaos`
## runs beside the checks, the two lanes then one after the other.
test: deps
	scripts/check-imports.py
	scripts/swift-build.sh --build-tests
	scripts/swift-test.sh 10 --filter BusTests
	scripts/with-s3.sh scripts/with-postgres.sh bash -c 'scripts/swift-test.sh 10 --filter "$(STORE_TESTS)" \
	  && scripts/swift-test.sh 20 --skip BusTests --skip "$(STORE_TESTS)" --skip "$(HEAVY_TESTS)" \
	  && scripts/swift-test.sh 20 --no-parallel --filter "$(HEAVY_TESTS)"'
	scripts/test-checks.sh

## The chaos checks on PostgreSQL in a release build, with the issue's latency target: with two
## replicas of each service and one killed every 5 s, p99 of POST /api/v1/jobs stays under
## 100 ms; then PostgreSQL itself killed every 5 s and restarted under load (503 while it is down,
## every request answered before its 5 s deadline, every admitted job and charge kept).
chaos-postgres: deps
	CONFIG=release STORE=postgres CHAOS_ONLY=quota,history,jobs CHAOS_FIRST=jobs-1,jobs-2 \
	  CHAOS_THRESHOLDS='POST /api/v1/jobs p99<100ms' scripts/chaos-check.sh
	CONFIG=release STORE=postgres CHAOS_ONLY=postgres CHAOS_THRESHOLDS='max<4950ms' scripts/chaos-check.sh

## Regenerates the client code from openapi.yaml (committed) and the sums of what it was made from
## and of what it made (Clients/openapi-generated.sha256: a test fails when they no longer match).
generate: deps
	scripts/swift-build.sh --product swift-openapi-generator
	rm -rf Clients/PhotoEditKit/Generated && mkdir -p Clients/PhotoEditKit/Generated
	$$(scripts/swift-build.sh --show-bin-path)/swift-openapi-generator generate openapi.yaml \
	  --config Clients/openapi-generator-config.yaml --output-directory Clients/PhotoEditKit/Generated
	scripts/embed-console.sh
	sha256sum openapi.yaml Clients/openapi-generator-config.yaml Clients/PhotoEditKit/Generated/*.swift > Clients/openapi-generated.sha256

## The console in Chromium (Selenium) against a stack of its own (needs the debug build).
console-check: deps
	scripts/swift-build.sh --build-tests
	scripts/console-check.sh

## The contract conformance run alone (needs the debug build).
conformance: deps
	scripts/swift-build.sh
	scripts/conformance.sh

## The app's flows for 60 s against the stack `make run` started; invariants checked after.
## ARGS="--chaos" kills a process every 8 s; see `loadtest --help` and docs/loadtest.md.
loadtest: deps
	@ARGS="$(ARGS)" CONFIG=$(CONFIG) scripts/loadtest.sh

## The gateway's hot paths (healthz, users/me, job creation) against a bare Hummingbird route.
bench-gateway: deps
	@scripts/bench-gateway.sh

## Bus against raw libzmq, same machine, same run.
bench-bus: deps
	@scripts/bench-bus.sh

## Durable quota decisions through the bus against an in-memory Redis limiter; STORE=postgres: on
## PostgreSQL with one and two replicas, against Redis with appendfsync always.
bench-quota: deps
	@scripts/bench-quota.sh

## Jobs per second against Celery + Redis, and scale-out over 1 to 16 workers.
bench-jobs: deps
	@scripts/bench-jobs.sh

## History pages and search over a 1,000,000-item history, through the gateway, against /healthz.
bench-history: deps
	@scripts/bench-history.sh

## 2,000 uploads of 2 MB through the app's flow, folder store against S3 store (a local RADOS Gateway).
bench-blobs: deps
	@scripts/bench-blobs.sh

## Models against the local provider fixture: image jobs per second against the providers' ceiling,
## and 1,000 five-second videos in flight with the worker slots they hold.
bench-models: deps
	@scripts/bench-models.sh

## What 1,000 open job event streams cost the jobs service and the gateway (CPU, descriptors).
stream-cost: deps
	scripts/swift-build.sh -c release --product quota && scripts/swift-build.sh -c release --product history
	scripts/swift-build.sh -c release --product jobs && scripts/swift-build.sh -c release --product gateway
	scripts/stream-cost.py $$(scripts/swift-build.sh -c release --show-bin-path) 1000

clean:
	rm -rf .build .data
