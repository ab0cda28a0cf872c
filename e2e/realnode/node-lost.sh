#!/usr/bin/env bash
# docs/design.md §12 on the real node (issue #39, scenario 1): a Job's pod runs on the real node,
# its kubelet is stopped for NODE_LOST_DOWN_SECONDS (default 100) and started again. While the node
# does not report, the order stays claimed and says `node_unreachable` with the node (the figure:
# seconds from the node's NotReady to the order saying so; at most 60); once the kubelet is back,
# the Job finishes and the order gets its verdict, once, from the one pod.
#
# The server and the executor run on this machine, not in pods: with a single real node, a node
# that does not report takes every Service endpoint on it (CoreDNS, serve) out of rotation, so an
# executor in a pod could not reach its server; on a real cluster they would be on other nodes.
#
# Needs KUBECONFIG and PULLMAN_TESTENV_STATE of a running test control plane with its real node,
# and the pullman binary (PULLMAN_BIN, default target/debug/pullman). Figures are appended to
# PULLMAN_FIGURES if set. Leaves the kubelet running and the node Ready.
set -euo pipefail
cd "$(dirname "$0")/../.."
SUITE=node-lost
# shellcheck source=../lib/check.sh
. e2e/lib/check.sh
# shellcheck source=../lib/serve.sh
. e2e/lib/serve.sh
: "${KUBECONFIG:?KUBECONFIG must point at the test control plane (e2e/testenv/up.sh)}"
STATE="${PULLMAN_TESTENV_STATE:-/tmp/pullman-testenv}"
export PULLMAN_TESTENV_STATE="$STATE"
PULLMAN="${PULLMAN_BIN:-$PWD/target/debug/pullman}"
DOWN="${NODE_LOST_DOWN_SECONDS:-100}"
[[ -x "$PULLMAN" ]] || fail "no pullman binary at $PULLMAN (cargo build --bin pullman)"
# The node must stay away long enough to be seen NotReady (~50 s) and the order to say so.
(( DOWN >= 90 )) || fail "NODE_LOST_DOWN_SECONDS=$DOWN: at least 90 (the node goes NotReady after ~50 s)"
node="$(k get nodes -l pullman.dev/node=real -o jsonpath='{.items[*].metadata.name}')"
node="${node%% *}"
[[ -n "$node" ]] || fail "no node labelled pullman.dev/node=real (PULLMAN_TESTENV_REAL_NODE=1)"

now() { date +%s; }
until_true() { # until_true SECONDS WHAT CMD...: CMD every second until it succeeds, else fail
  local secs="$1" what="$2" i
  shift 2
  for (( i = 0; i < secs; i++ )); do "$@" && return 0; sleep 1; done
  fail "$what: not within $secs s"
}
node_ready() { k get node "$node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}'; }

WORK="$(mktemp -d /tmp/pullman-node-lost.XXXXXX)"
NS="node-lost-$(openssl rand -hex 3)"
exec_pid="" restart_pid=""
diagnose() {
  echo "--- node $node"; k get node "$node" -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}{"\n"}{end}' || true
  echo "--- pods"; k get pods -n "$NS" -o wide || true
  echo "--- executor log (last 30 lines)"; tail -n 30 "$WORK/executor.log" 2>/dev/null || true
  echo "--- serve log (last 10 lines)"; tail -n 10 "$WORK/serve.log" 2>/dev/null || true
}
cleanup() {
  set +e
  # A kubelet stopped by this script is started again, and its node Ready, before anything else
  # goes.
  if [[ -n "$restart_pid" ]]; then
    wait "$restart_pid"
    for _ in $(seq 120); do [[ "$(node_ready)" == True ]] && break; sleep 1; done
  fi
  [[ -n "$exec_pid" ]] && kill -TERM "$exec_pid" 2>/dev/null && wait "$exec_pid"
  serve_stop
  k delete namespace "$NS" --wait=false >/dev/null 2>&1
  rm -rf "$WORK"
}
trap cleanup EXIT

step "a server and an executor on this machine; a Job on the real node"
PULLMAN_ADMIN_TOKEN="$(openssl rand -hex 16)"
export PULLMAN_ADMIN_TOKEN
serve_start "$PULLMAN" "$WORK"
admin() { curl -sS --fail-with-body -H "Authorization: Bearer $PULLMAN_ADMIN_TOKEN" -H 'content-type: application/json' "$@"; }
k create namespace "$NS" >/dev/null
agent="$(admin -X POST "$base/api/v1/agents" -d '{"name": "node-lost", "labels": ["node-lost"]}')" \
  || fail "registering the agent: $agent"
jsonf 'd["token"]' <<<"$agent" > "$WORK/token"
"$PULLMAN" executor --server "$base" --token-file "$WORK/token" --target-namespace "$NS" \
  --lease-seconds 15 > "$WORK/executor.log" 2>&1 &
exec_pid=$!
# Runs past the kubelet's absence, then ends well soon after: its verdict comes from the
# kubelet's report.
run=$(( DOWN + 20 ))
job="apiVersion: batch/v1
kind: Job
metadata: {name: lost}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      nodeSelector: {pullman.dev/node: real}
      tolerations: [{key: pullman.dev/node, operator: Equal, value: real, effect: NoSchedule}]
      containers:
      - name: main
        image: localhost/busybox:dev
        command: [sh, -c, 'echo start; sleep $run; echo done']"
body="$(python3 -c 'import json, sys; print(json.dumps({"work_type": "custom", "yaml_content": sys.argv[1], "claim_timeout_seconds": 900, "targeting": {"labels": ["node-lost"]}}))' "$job")"
id="$(admin -X POST "$base/api/v1/work-orders" -d "$body" | jsonf 'd["id"]')" || fail "creating the order"
pod_running() { [[ "$(k get pods -n "$NS" -l batch.kubernetes.io/job-name=lost -o jsonpath='{.items[*].status.phase}')" == Running ]]; }
until_true 120 "the Job's pod Running on $node" pod_running
ok "order $id: its Job's pod runs on $node"

step "the kubelet stopped for $DOWN s under the running pod"
e2e/testenv/restart.sh kubelet "$DOWN" > "$WORK/restart.log" 2>&1 &
restart_pid=$!
t_stop=$(now)
not_ready() { [[ "$(node_ready)" != True ]]; }
until_true 120 "node $node NotReady" not_ready
# When the node lifecycle controller saw it, as it wrote it.
went="$(k get node "$node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].lastTransitionTime}')"
[[ -n "$went" ]] || fail "node $node has no Ready transition time"
not_ready_at="$(date -d "$went" +%s)"
order() { admin "$base/api/v1/work-orders/$id"; }
says_unreachable() { [[ "$(order | jsonf 'd.get("waiting", {}).get("reason")' 2>/dev/null)" == node_unreachable ]]; }
until_true 90 "order $id saying node_unreachable" says_unreachable
said=$(( $(now) - not_ready_at ))
not_ready || fail "node $node was Ready again before the order said node_unreachable: too late to tell"
o="$(order)"
[[ "$(jsonf 'd["status"]' <<<"$o")" == CLAIMED ]] || fail "order $id is not claimed while its node does not report: $o"
[[ "$(jsonf 'd["waiting"]["node"]["name"]' <<<"$o")" == "$node" ]] || fail "the order does not name node $node: $o"
(( said <= 60 )) || fail "the order said node_unreachable $said s after the node went NotReady (goal: 60)"
ok "node NotReady $(( not_ready_at - t_stop )) s after the kubelet stopped; the order said node_unreachable $said s later, naming $node"
[[ -n "${PULLMAN_FIGURES:-}" ]] && echo "node NotReady → order says node_unreachable (s): $said" >> "$PULLMAN_FIGURES"

step "the kubelet back: the Job's own verdict, once"
wait "$restart_pid" || fail "restarting the kubelet: $(cat "$WORK/restart.log")"
restart_pid=""
is_ready() { [[ "$(node_ready)" == True ]]; }
until_true 120 "node $node Ready again" is_ready
in_log() { admin "$base/api/v1/work-order-log/$id" > "$WORK/entry.json" 2>/dev/null; }
until_true $(( run + 120 )) "order $id in the log" in_log
entry="$(cat "$WORK/entry.json")"
[[ "$(jsonf 'd["outcome"]' <<<"$entry")" == succeeded ]] || fail "order $id did not succeed: $entry"
[[ "$(jsonf 'len(d["attempts"])' <<<"$entry")" == 1 ]] || fail "order $id took more than one attempt: $entry"
pods="$(k get pods -n "$NS" -l batch.kubernetes.io/job-name=lost -o name | wc -l)"
(( pods == 1 )) || fail "Job lost has $pods pods, not 1"
ok "the Job succeeded after the kubelet came back; one attempt, one pod"
finish
