#!/usr/bin/env bash
# The operating kit against a real Prometheus (Debian's, installed if missing):
# 1. `promtool check rules` and `promtool test rules` on deploy/prometheus (every alert's unit test);
# 2. a stack of the debug build (quota, history, jobs, a worker, the gateway) on free ports with
#    data in a scratch folder; `promtool check metrics` on its live scrape must report nothing;
# 3. Prometheus started on a free port in that folder, scraping the gateway every 3 s with the
#    shipped alert rules; through its HTTP API: the gateway's and every service's and the worker's
#    series are there, `rate()` of a counter that has not moved is 0 (not absent), every rule
#    loaded and evaluates without error, and every query of the Grafana dashboard returns data.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  echo "installing prometheus"
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

echo "== promtool: the rules and their unit tests"
promtool check rules deploy/prometheus/alerts.yml
(cd deploy/prometheus && promtool test rules alerts.test.yml)

start_debug_stack

echo "== promtool check metrics on a live scrape"
curl -fsS "$gateway/metrics" > "$work/scrape.txt"
problems=$(promtool check metrics < "$work/scrape.txt" 2>&1 || true)
if [ -n "$problems" ]; then echo "$problems"; exit 1; fi
echo "  $(grep -c '^# TYPE' "$work/scrape.txt") families, nothing reported"

echo "== a real Prometheus scraping the gateway with the shipped rules"
prometheus_port=$(port)
mkdir -p "$work/prometheus"
cp deploy/prometheus/alerts.yml "$work/prometheus/alerts.yml"
# Scraped every 3 s, each scrape given 3 s: the gateway waits up to 2 s for each service's part
# (MetricsController.scrapeTimeout), and a scrape took 0.3 to 0.5 s of this debug stack with both
# cores kept busy. Scraped every second with 1 s each, a `bash .ci/run` beside stress-ng once saw
# no scrape succeed in 45 s (which the failure now explains: the target's last error).
cat > "$work/prometheus/prometheus.yml" <<CONFIG
global: { scrape_interval: 3s, scrape_timeout: 3s, evaluation_interval: 1s }
rule_files: [alerts.yml]
scrape_configs:
  - job_name: photoedit
    static_configs: [{ targets: ["127.0.0.1:$GATEWAY_PORT"] }]
CONFIG
prometheus --config.file="$work/prometheus/prometheus.yml" --storage.tsdb.path="$work/prometheus/data" \
  --web.listen-address="127.0.0.1:$prometheus_port" > "$work/prometheus.log" 2>&1 & pids+=($!)
if ! python3 scripts/prometheus-check.py "http://127.0.0.1:$prometheus_port" deploy/grafana/photoedit.json; then
  echo "Prometheus' log:"; tail -20 "$work/prometheus.log"
  echo "the gateway's log:"; tail -20 "$work/gateway.log"
  exit 1
fi
