#!/usr/bin/env bash
# Executor footprint with N Jobs running at once (issue #16): RSS and TCP connections of
# `pullman executor --concurrency N` to the API server while N Job orders are watched.
#
# Needs the test control plane (`eval "$(e2e/testenv/up.sh)"`, so KUBECONFIG is set), PostgreSQL
# server binaries for `pullman serve`'s embedded database, and a built binary
# (PULLMAN_BIN, default target/debug/pullman). N (default 100) orders whose Jobs stay Running for
# RUN (default 60s, kwok's run-duration annotation) are queued; once all N Jobs exist the
# executor's VmRSS/VmHWM and its established connections to the API server are printed
# (AFTER=secs waits longer first; SHOWLOG=n also prints the executor's last n outcome lines).
# Measured (debug build, testenv, N=100): before the shared watch 26.6 MiB / 100 connections;
# with it 22.0 MiB / 2 connections (one watch of Jobs, one pooled for applies). With output on,
# N=10/40: one pod watch per Job 12/43 connections; one shared pod watch 3-6 at any N.
set -euo pipefail
BIN=${PULLMAN_BIN:-target/debug/pullman}
N=${N:-100}
RUN=${RUN:-60s}
: "${KUBECONFIG:?run eval \"\$(e2e/testenv/up.sh)\" first}"
work=$(mktemp -d)
chmod 755 "$work"  # the embedded PostgreSQL runs as its own user
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
admin=bench-admin-token-0123456789abcdef
base=http://127.0.0.1:$port
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; kubectl delete ns "$ns" --wait=false >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
ns=footprint-$RANDOM
kubectl create ns "$ns" >/dev/null
"$BIN" serve --listen "127.0.0.1:$port" --data-dir "$work/data" --controller off \
  --admin-token "$admin" >"$work/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 120); do curl -fs "$base/readyz" >/dev/null && break; sleep 0.5; done
curl -fs "$base/readyz" >/dev/null || { cat "$work/serve.log"; exit 1; }
token=$(curl -fs -H "Authorization: Bearer $admin" -H 'content-type: application/json' \
  -d "{\"name\":\"footprint\",\"labels\":[\"$ns\"]}" "$base/api/v1/agents" | jq -r .token)
echo "$token" >"$work/token"
"$BIN" executor --server "$base" --token-file "$work/token" --target-namespace "$ns" \
  --concurrency "$N" >"$work/executor.log" 2>&1 &
expid=$!
pids+=($expid)
for i in $(seq 1 "$N"); do
  yaml=$(printf 'apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: j%s\nspec:\n  backoffLimit: 0\n  template:\n    metadata:\n      annotations: {pullman.dev/kwok-run-duration: "%s"}\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: main\n        image: busybox\n' "$i" "$RUN")
  jq -n --arg y "$yaml" --arg ns "$ns" \
    '{work_type: "custom", claim_timeout_seconds: 900, yaml_content: $y, targeting: {labels: [$ns]}}' |
    curl -fs -o /dev/null -H "Authorization: Bearer $admin" -H 'content-type: application/json' \
      --data-binary @- "$base/api/v1/work-orders"
done
for _ in $(seq 1 240); do
  jobs=$(kubectl get jobs -n "$ns" --no-headers 2>/dev/null | wc -l)
  [ "$jobs" -ge "$N" ] && break
  sleep 0.5
done
sleep 5
apiport=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}' | sed 's/.*://')
conns=$(ss -tnp state established "( dport = :$apiport )" | grep -c "pid=$expid," || true)
rss=$(awk '/VmRSS/{print $2}' /proc/$expid/status)
hwm=$(awk '/VmHWM/{print $2}' /proc/$expid/status)
running=$(kubectl get jobs -n "$ns" --no-headers | wc -l)
sleep "${AFTER:-0}"; grep -E "completed|failed|error|WARN" "$work/executor.log" | tail -"${SHOWLOG:-0}" >&2 || true
echo "jobs=$running concurrency=$N executor_rss_kib=$rss executor_hwm_kib=$hwm apiserver_connections=$conns"
