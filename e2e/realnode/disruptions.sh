#!/usr/bin/env bash
# docs/design.md §12 on the real node (issue #39), four disruptions under running orders:
# 1. node lost: a Job's pod runs on the real node, its kubelet is stopped for NODE_LOST_DOWN_SECONDS
#    (default 100) and started again. While the node does not report, the order stays claimed and
#    says `node_unreachable` with the node (the figure: seconds from the node's NotReady to the
#    order saying so; at most 60); once the kubelet is back, the Job finishes and the order gets
#    its verdict, once, from the one pod. Beside it runs a pod that tolerates the unreachable
#    node for 5 s only: the taint manager deletes it and the Job controller fails its Job while
#    the node is away, and its order stays claimed until the kubelet is back and stops the pod;
#    then it fails as `disrupted` (no verdict on the taint manager's word alone).
# 2. drain: `kubectl drain` evicts the pod of an order with `retry_on_disruption: safe`. The
#    attempt is `disrupted`, the order runs again once the first pod stopped, and the two runs
#    never overlap: each pod writes when it starts and stops to a file on the node, and the second
#    start comes after the first stop.
# 3. containerd killed (SIGKILL) for 30 s under a running order: the container runs on in its
#    shim, the order stays claimed (saying what the kubelet makes of it), and once containerd is
#    back the Job ends and the order gets its verdict, once, from one pod in one attempt.
# 4. the executor's process SIGKILLed mid-Job and started again: its claim's lease runs out, the
#    order is handed out again, and the new executor re-adopts the one Job (one Job, one pod)
#    and reports its verdict. (The executor's pod deleted with grace 0 is e2e/scenario/faults.sh.)
#
# The server and the executor run on this machine, not in pods: with a single real node, a node
# that does not report takes every Service endpoint on it (CoreDNS, serve) out of rotation, so an
# executor in a pod could not reach its server; on a real cluster they would be on other nodes.
#
# Needs KUBECONFIG and PULLMAN_TESTENV_STATE of a running test control plane with its real node,
# and the pullman binary (PULLMAN_BIN, default target/debug/pullman). Figures are appended to
# PULLMAN_FIGURES if set. Leaves the kubelet running and the node Ready and schedulable.
set -euo pipefail
cd "$(dirname "$0")/../.."
SUITE=disruptions
# shellcheck source=../lib/check.sh
. e2e/lib/check.sh
# shellcheck source=../lib/serve.sh
. e2e/lib/serve.sh
: "${KUBECONFIG:?KUBECONFIG must point at the test control plane (e2e/testenv/up.sh)}"
# shellcheck source=../lib/realnode.sh
. e2e/lib/realnode.sh
DOWN="${NODE_LOST_DOWN_SECONDS:-100}"
# The node must stay away long enough to be seen NotReady (~50 s) and the order to say so.
(( DOWN >= 90 )) || fail "NODE_LOST_DOWN_SECONDS=$DOWN: at least 90 (the node goes NotReady after ~50 s)"
real_node

now() { date +%s; }
node_ready() { k get node "$node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}'; }

WORK="$(mktemp -d /tmp/pullman-disruptions.XXXXXX)"
NS="disruptions-$(openssl rand -hex 3)"
# Where the drained order's pods write when they start and stop (a hostPath on the node).
RUNS="/var/tmp/pullman-$NS"
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
  k uncordon "$node" >/dev/null 2>&1
  [[ -n "$exec_pid" ]] && kill -TERM "$exec_pid" 2>/dev/null && wait "$exec_pid"
  serve_stop
  k delete namespace "$NS" --wait=false >/dev/null 2>&1
  rm -rf "$WORK" "$RUNS"
}
trap cleanup EXIT

step "a server and an executor on this machine; a Job on the real node"
PULLMAN_ADMIN_TOKEN="$(openssl rand -hex 16)"
export PULLMAN_ADMIN_TOKEN
serve_start "$PULLMAN" "$WORK"
# real_job NAME CMD [POD_SPEC_LINES [CONTAINER_LINES [TOLERATION]]]: a Job of one pod on the real
# node running `sh -c CMD` (one line, no single quotes), with no retries of its own, so its
# verdict is its pod's; TOLERATION (a YAML flow mapping) is added to the pod's tolerations.
real_job() {
  cat <<EOF
apiVersion: batch/v1
kind: Job
metadata: {name: $1}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      nodeSelector: {pullman.dev/node: real}
      tolerations: [{key: pullman.dev/node, operator: Equal, value: real, effect: NoSchedule}${5:+, $5}]
${3:-}
      containers:
      - name: main
        image: localhost/busybox:dev
${4:-}
        command: [sh, -c, '$2']
EOF
}
# queue_order YAML [FIELDS_JSON]: queues an order of YAML for this suite's agent, with FIELDS_JSON
# (an object) added to the create body; prints its id.
queue_order() {
  local extra="${2:-}" body
  [[ -n "$extra" ]] || extra='{}'
  body="$(python3 -c 'import json, sys; print(json.dumps({"work_type": "custom", "yaml_content": sys.argv[1], "claim_timeout_seconds": 900, "targeting": {"labels": ["disruptions"]}, **json.loads(sys.argv[2])}))' "$1" "$extra")"
  admin -X POST "$base/api/v1/work-orders" -d "$body" | jsonf 'd["id"]'
}
# pod_running JOB: the pod of Job JOB runs.
pod_running() { [[ "$(k get pods -n "$NS" -l "batch.kubernetes.io/job-name=$1" -o jsonpath='{.items[*].status.phase}')" == Running ]]; }
# The current order ($id): active, and once finished, its log entry in $WORK/entry.json.
order() { admin "$base/api/v1/work-orders/$id"; }
in_log() { admin "$base/api/v1/work-order-log/$id" > "$WORK/entry.json" 2>/dev/null; }
k create namespace "$NS" >/dev/null
agent="$(admin -X POST "$base/api/v1/agents" -d '{"name": "disruptions", "labels": ["disruptions"]}')" \
  || fail "registering the agent: $agent"
jsonf 'd["token"]' <<<"$agent" > "$WORK/token"
"$PULLMAN" executor --server "$base" --token-file "$WORK/token" --target-namespace "$NS" \
  --lease-seconds 15 > "$WORK/executor.log" 2>&1 &
exec_pid=$!
# Runs past the kubelet's absence, then ends well soon after: its verdict comes from the
# kubelet's report.
run=$(( DOWN + 20 ))
tainted="$(queue_order "$(real_job tainted "echo start; sleep $run; echo done" "" "" \
  "{key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 5}")")" \
  || fail "creating the order"
id="$(queue_order "$(real_job lost "echo start; sleep $run; echo done")")" || fail "creating the order"
until_true 120 "the Job's pod Running on $node" pod_running lost
until_true 60 "Job tainted's pod Running on $node" pod_running tainted
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

# The taint manager deletes the pod that tolerates the unreachable node for 5 s only, and the Job
# controller counts it failed at once; its order takes no verdict on that word while the node is
# away, looked at every 2 s until the kubelet is back.
job_failed() { [[ "$(k get job tainted -n "$NS" -o jsonpath='{.status.conditions[?(@.type=="FailureTarget")].status}')" == True ]]; }
until_true 60 "Job tainted failed by the Job controller after the taint manager's deletion" job_failed
reason="$(k get pods -n "$NS" -l batch.kubernetes.io/job-name=tainted -o jsonpath='{.items[0].status.conditions[?(@.type=="DisruptionTarget")].reason}')"
[[ "$reason" == DeletionByTaintManager ]] || fail "Job tainted's pod has DisruptionTarget reason '$reason', not DeletionByTaintManager"
looks=0
while kill -0 "$restart_pid" 2>/dev/null; do
  o="$(admin "$base/api/v1/work-orders/$tainted")" || fail "order $tainted took a verdict while its node did not report (on the taint manager's word)"
  [[ "$(jsonf 'd["status"]' <<<"$o")" == CLAIMED ]] || fail "order $tainted is not claimed while its node does not report: $o"
  looks=$(( looks + 1 ))
  sleep 2
done
(( looks >= 3 )) || fail "only $looks looks at order $tainted before the kubelet was back: the taint manager acted too late to tell"
ok "Job tainted failed on the taint manager's word ($reason); its order stayed claimed for $looks looks until the kubelet was back"
step "the kubelet back: the Job's own verdict, once"
wait "$restart_pid" || fail "restarting the kubelet: $(cat "$WORK/restart.log")"
restart_pid=""
is_ready() { [[ "$(node_ready)" == True ]]; }
until_true 120 "node $node Ready again" is_ready
until_true $(( run + 120 )) "order $id in the log" in_log
entry="$(cat "$WORK/entry.json")"
[[ "$(jsonf 'd["outcome"]' <<<"$entry")" == succeeded ]] || fail "order $id did not succeed: $entry"
[[ "$(jsonf 'len(d["attempts"])' <<<"$entry")" == 1 ]] || fail "order $id took more than one attempt: $entry"
pods="$(k get pods -n "$NS" -l batch.kubernetes.io/job-name=lost -o name | wc -l)"
(( pods == 1 )) || fail "Job lost has $pods pods, not 1"
ok "the Job succeeded after the kubelet came back; one attempt, one pod"
id="$tainted"
until_true 120 "order $tainted in the log" in_log
entry="$(cat "$WORK/entry.json")"
[[ "$(jsonf 'd["outcome"]' <<<"$entry")" == failed ]] || fail "order $tainted did not fail: $entry"
[[ "$(jsonf '",".join(a["result"] for a in d["attempts"])' <<<"$entry")" == disrupted ]] \
  || fail "order $tainted: attempts are not [disrupted]: $entry"
[[ "$(jsonf 'd["message"]' <<<"$entry")" == *DeletionByTaintManager* ]] || fail "order $tainted's message does not name the taint manager: $entry"
ok "order $tainted failed once its kubelet stopped the pod, as disrupted: $(jsonf 'd["message"]' <<<"$entry")"

step "kubectl drain under an order with retry_on_disruption: safe"
mkdir -p "$RUNS"
# The first run works until it is stopped; a later one (the file has a start already) 5 s.
# Each writes its start and its stop, in seconds since the epoch; told to stop (SIGTERM), a run
# goes on 5 s more before it does, as work that cleans up does: a second run started when the
# first was told to stop, rather than when it stopped, would overlap it.
drain_cmd='n=600; [ -s /runs/log ] && n=5; echo "start $(hostname) $(date +%s)" >> /runs/log; trap "sleep 5; echo \"stop \$(hostname) \$(date +%s)\" >> /runs/log; exit 143" TERM; sleep $n & wait $!; echo "stop $(hostname) $(date +%s)" >> /runs/log'
job="$(real_job drained "$drain_cmd" "      terminationGracePeriodSeconds: 10
      volumes: [{name: runs, hostPath: {path: $RUNS, type: Directory}}]" \
  "        volumeMounts: [{name: runs, mountPath: /runs}]")"
id="$(queue_order "$job" '{"retry_on_disruption": "safe"}')" || fail "creating the drained order"
drained_running() { pod_running drained && [[ -s "$RUNS/log" ]]; }
until_true 120 "the drained Job's pod Running on $node" drained_running
first="$(k get pods -n "$NS" -l batch.kubernetes.io/job-name=drained -o jsonpath='{.items[0].metadata.name}')"
# In the background: the drain waits for the pod to be gone, and the node must be back in
# service as soon as the order says the attempt was disrupted, so that the second run could be
# placed at once if the executor reported before the first run stopped.
k drain "$node" --pod-selector=batch.kubernetes.io/job-name=drained --ignore-daemonsets \
  --delete-emptydir-data --timeout=120s > "$WORK/drain.log" 2>&1 &
drain_pid=$!
attempts() { admin "$base/api/v1/work-orders/$id/attempts"; }
disrupted() { [[ "$(attempts | jsonf '",".join(a["result"] for a in d)' 2>/dev/null)" == disrupted* ]]; }
until_true 120 "order $id recording a disrupted attempt" disrupted
k uncordon "$node" >/dev/null
ok "pod $first evicted; the attempt is disrupted: $(attempts | jsonf 'd[0]["message"]')"
wait "$drain_pid" || fail "kubectl drain: $(cat "$WORK/drain.log")"
until_true 180 "order $id in the log" in_log
entry="$(cat "$WORK/entry.json")"
[[ "$(jsonf 'd["outcome"]' <<<"$entry")" == succeeded ]] || fail "order $id did not succeed: $entry"
[[ "$(jsonf '",".join(a["result"] for a in d["attempts"])' <<<"$entry")" == disrupted,succeeded ]] \
  || fail "order $id: attempts are not [disrupted, succeeded]: $entry"
[[ "$(jsonf 'd["retry_count"]' <<<"$entry")" == 0 ]] || fail "a disruption spent a retry: $entry"
# Two runs, each started and stopped once, the second starting after the first stopped.
python3 - "$RUNS/log" "$first" <<'PY' || fail "the runs overlap or are not two: $(cat "$RUNS/log")"
import sys
lines = [l.split() for l in open(sys.argv[1]) if l.strip()]
runs = {}
for what, pod, t in lines:
    runs.setdefault(pod, {})[what] = int(t)
first = sys.argv[2]
assert len(runs) == 2 and first in runs, runs
second = next(p for p in runs if p != first)
assert set(runs[first]) == {"start", "stop"} and set(runs[second]) == {"start", "stop"}, runs
assert runs[second]["start"] >= runs[first]["stop"], runs
print(f"    first run {runs[first]['start']}-{runs[first]['stop']}, second {runs[second]['start']}-{runs[second]['stop']}")
PY
jobs="$(k get jobs -n "$NS" -l pullman.dev/work-order="$id" -o name | wc -l)"
(( jobs == 1 )) || fail "order $id left $jobs Jobs, not 1"
ok "drained: one disrupted attempt, one retry after the first pod stopped, no overlap, no retry spent"

step "containerd killed for 30 s under a running order"
id="$(queue_order "$(real_job runtime "echo start; sleep 60; echo done")")" || fail "creating the order"
until_true 120 "the Job's pod Running on $node" pod_running runtime
e2e/testenv/restart.sh containerd 30 KILL > "$WORK/restart.log" 2>&1 &
restart_pid=$!
# What the order says while containerd is away, every 2 s.
said=()
for _ in $(seq 15); do
  said+=("$(order | jsonf '(d["status"], d.get("waiting", {}).get("reason"))' 2>/dev/null || echo '?')")
  sleep 2
done
wait "$restart_pid" || fail "restarting containerd: $(cat "$WORK/restart.log")"
restart_pid=""
until_true 180 "order $id in the log" in_log
entry="$(cat "$WORK/entry.json")"
[[ "$(jsonf 'd["outcome"]' <<<"$entry")" == succeeded ]] || fail "order $id did not succeed: $entry"
[[ "$(jsonf 'len(d["attempts"])' <<<"$entry")" == 1 ]] || fail "order $id took more than one attempt: $entry"
pods="$(k get pods -n "$NS" -l batch.kubernetes.io/job-name=runtime -o name | wc -l)"
(( pods == 1 )) || fail "Job runtime has $pods pods, not 1"
ok "containerd back: the Job succeeded, one attempt, one pod; the order said meanwhile: $(printf '%s\n' "${said[@]}" | sort | uniq -c | tr -s ' \n' ' ')"

step "the executor SIGKILLed mid-Job and started again: the Job re-adopted"
id="$(queue_order "$(real_job adopted "echo start; sleep 40; echo done")")" || fail "creating the order"
until_true 120 "the Job's pod Running on $node" pod_running adopted
kill -KILL "$exec_pid"
wait "$exec_pid" 2>/dev/null || true
"$PULLMAN" executor --server "$base" --token-file "$WORK/token" --target-namespace "$NS" \
  --lease-seconds 15 >> "$WORK/executor.log" 2>&1 &
exec_pid=$!
until_true 180 "order $id in the log" in_log
entry="$(cat "$WORK/entry.json")"
[[ "$(jsonf 'd["outcome"]' <<<"$entry")" == succeeded ]] || fail "order $id did not succeed: $entry"
[[ "$(jsonf '",".join(a["result"] for a in d["attempts"])' <<<"$entry")" == reclaimed,succeeded ]] \
  || fail "order $id: attempts are not [reclaimed, succeeded]: $entry"
jobs="$(k get jobs -n "$NS" -l pullman.dev/work-order="$id" -o name | wc -l)"
pods="$(k get pods -n "$NS" -l batch.kubernetes.io/job-name=adopted -o name | wc -l)"
(( jobs == 1 && pods == 1 )) || fail "order $id: $jobs Jobs and $pods pods, not 1 and 1"
ok "the new executor re-adopted the Job: succeeded, attempts [reclaimed, succeeded], one Job, one pod"
finish
