#!/usr/bin/env bash
# Side-by-side load benchmark (issue: gateway core). One run, interleaved rounds:
#   upstream   wrk → upstream                       (the floor: no proxy at all)
#   nolimit    wrk → sluice → upstream              (proxy cost)
#   redis      wrk → sluice + sliding_log on Redis → upstream (limiter cost)
#   flood      the same sluice, every request on ONE key: all but the first
#              `limit` are denied (429s; non-2xx are not errors here)
# In the first three, every request carries a random X-Key; the Redis limit is
# keyed on it, so nothing is denied and every request is one EVALSHA. Prints
# medians (and min–max) of req/s, p50, p99, the ratio of each case to
# `nolimit`, the serving process's CPU per request, and for the flood the Redis
# calls per request (the deny cache should answer nearly all of them).
#
# Usage: benches/load.sh [rounds=3] [seconds=5] [connections=32]
# Needs: wrk, redis-server (apt-get install wrk redis-server), a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECONDS_PER_RUN=${2:-5}
CONNECTIONS=${3:-32}
THREADS=1   # sluice and upstream worker threads: the comparison is per core

for tool in wrk redis-server; do
  command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install $tool)"; exit 1; }
done
cargo build --release --quiet --bin sluice --example bench_upstream
BIN=target/release/sluice
UPSTREAM_BIN=target/release/examples/bench_upstream

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened"; exit 1; }

WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -INT "$p" 2>/dev/null || true; done; sleep 0.3; for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

REDIS_PORT=$(free_port); UP_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no >/dev/null & PIDS+=($!)
"$UPSTREAM_BIN" "127.0.0.1:$UP_PORT" "$THREADS" >/dev/null 2>&1 & PIDS+=($!); UP_PID=$!
wait_port "$REDIS_PORT"; wait_port "$UP_PORT"

start_sluice() { # name, limits-yaml; sets STARTED_PORT
  local port admin
  port=$(free_port); admin=$(free_port)
  cat > "$WORK/$1.yaml" <<YAML
server: { listen: ["127.0.0.1:$port"], admin: "127.0.0.1:$admin", threads: $THREADS }
limiter:
  redis: { url: "redis://127.0.0.1:$REDIS_PORT/0", timeout: 50ms }
  on_error: allow
upstreams:
  api: { servers: ["127.0.0.1:$UP_PORT"] }
routes:
  - name: bench
    upstream: api
$2
YAML
  RUST_LOG=warn "$BIN" --config "$WORK/$1.yaml" >/dev/null 2>"$WORK/$1.log" & PIDS+=($!)
  STARTED_PID=$!
  wait_port "$port"
  STARTED_PORT=$port
}
start_sluice nolimit "    limits: []"; NOLIMIT_PORT=$STARTED_PORT; NOLIMIT_PID=$STARTED_PID
start_sluice redis "    limits:
      - { name: per-key, key: [{header: X-Key}], limit: 1000, window: 1m }"; REDIS_LIMIT_PORT=$STARTED_PORT; REDIS_LIMIT_PID=$STARTED_PID

declare -A TARGET=([upstream]=$UP_PORT [nolimit]=$NOLIMIT_PORT [redis]=$REDIS_LIMIT_PORT)
TARGET[flood]=$REDIS_LIMIT_PORT
declare -A SERVER_PID=([upstream]=$UP_PID [nolimit]=$NOLIMIT_PID [redis]=$REDIS_LIMIT_PID [flood]=$REDIS_LIMIT_PID)
declare -A SCRIPT=([upstream]=benches/random_key.lua [nolimit]=benches/random_key.lua [redis]=benches/random_key.lua [flood]=benches/one_key.lua)
evalsha_calls() { redis-cli -p "$REDIS_PORT" info commandstats | tr -d '\r' | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\).*/\1/p'; }
# CPU time (user + system, in clock ticks) the serving process has used so far.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TICKS_PER_SECOND=$(getconf CLK_TCK)
CASES=(upstream nolimit redis flood)
for case in "${CASES[@]}"; do  # warm-up: connections, pools, script cache
  wrk -t1 -c"$CONNECTIONS" -d1s -s "${SCRIPT[$case]}" "http://127.0.0.1:${TARGET[$case]}/bench" >/dev/null
done
for round in $(seq "$ROUNDS"); do
  for case in "${CASES[@]}"; do
    before=$(cpu_ticks "${SERVER_PID[$case]}"); calls_before=$(evalsha_calls)
    line=$(wrk -t1 -c"$CONNECTIONS" -d"${SECONDS_PER_RUN}s" -s "${SCRIPT[$case]}" \
      "http://127.0.0.1:${TARGET[$case]}/bench" | grep '^RESULT')
    after=$(cpu_ticks "${SERVER_PID[$case]}"); calls_after=$(evalsha_calls)
    line="$line redis_calls=$((calls_after - calls_before)) cpu_s=$(awk -v t=$((after - before)) -v hz="$TICKS_PER_SECOND" 'BEGIN {printf "%.3f", t / hz}')"
    echo "round $round $case $line" >&2
    echo "$case $line" >> "$WORK/results"
  done
done

evalsha=$(redis-cli -p "$REDIS_PORT" info commandstats | grep '^cmdstat_evalsha:' | tr -d '\r' || true)
echo
echo "sluice load benchmark — $(date -u +%Y-%m-%d), $(nproc) cores, wrk -t1 -c$CONNECTIONS, ${SECONDS_PER_RUN}s × $ROUNDS interleaved rounds, $THREADS worker thread(s)"
echo
python3 - "$WORK/results" "$evalsha" "$SECONDS_PER_RUN" <<'PY'
import sys, statistics, re
rows = {}
for line in open(sys.argv[1]):
    case = line.split()[0]
    vals = dict(re.findall(r'(\w+)=([\d.]+)', line))
    rows.setdefault(case, []).append({k: float(v) for k, v in vals.items()})
def med(case, k): return statistics.median(r[k] for r in rows[case])
base = med("nolimit", "rps")
# CPU µs the serving process spent per request (more robust than req/s on a
# shared machine: it does not depend on how much CPU the other processes got).
secs = float(sys.argv[3])
for case in rows:
    for r in rows[case]:
        r["cpu_us"] = r["cpu_s"] * 1e6 / max(r["rps"] * secs, 1)
print("| case | req/s (median) | min–max | p50 ms | p99 ms | ratio to nolimit | server CPU µs/request | errors |")
print("|---|---|---|---|---|---|---|---|")
for case, label in [("upstream", "upstream alone"), ("nolimit", "sluice, no limits"), ("redis", "sluice, sliding_log on Redis"), ("flood", "sluice, flood on one key (denied)")]:
    rps = [r["rps"] for r in rows[case]]
    print(f"| {label} | {med(case,'rps'):.0f} | {min(rps):.0f}–{max(rps):.0f} | {med(case,'p50_ms'):.2f} | {med(case,'p99_ms'):.2f} | {med(case,'rps')/base:.2f}× | {med(case,'cpu_us'):.1f} | {sum(r['errors'] for r in rows[case]):.0f} |")
flood_requests = sum(r["rps"] * secs for r in rows["flood"])
flood_calls = sum(r["redis_calls"] for r in rows["flood"])
print(f"\nFlood: {flood_calls / max(flood_requests, 1):.4f} Redis calls per request "
      f"({flood_calls:.0f} calls for {flood_requests:.0f} requests); denied requests served at "
      f"{med('flood', 'rps') / med('redis', 'rps'):.2f}× the allowed-request (redis) throughput.")
print("Errors count non-2xx responses too, except in the flood, where 429 is the expected answer.")
stats = dict(re.findall(r'(\w+)=([\d.]+)', sys.argv[2]))
if stats:
    print(f"Redis: {float(stats['usec_per_call']):.1f} µs of Redis time per EVALSHA over the whole run.")
PY
