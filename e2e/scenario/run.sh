#!/usr/bin/env bash
# The end-to-end scenario on a cluster whose pods really run: the chart installed as a platform
# team installs it, then what users and operators rely on, each checked in its pods. One place for
# the steps, run by every environment that has real nodes:
#   - e2e/realnode/test.sh: the test control plane's real node (CI, every run);
#   - e2e/kind/run.sh: a kind cluster (machines with Docker; the Tiltfile's `e2e-scenario` resource).
# The caller prepares the cluster (image loaded, PostgreSQL and its Secret) and says, in the
# environment, how this cluster differs:
#   SCENARIO_VALUES      values file for the chart (image, database secret, placement) (required)
#   SCENARIO_PLACEMENT   JSON merged into the pod spec of the Jobs the WorkOrders run, to put them
#                        where containers run (default {})
#   SCENARIO_IMAGE       image of those Jobs' containers, with sh, echo, sleep (default busybox:1.37)
#   SCENARIO_SERVE_URL   how this machine reaches serve: `service` (its ClusterIP routes here, as
#                        with kube-proxy on this host) or `port-forward` (default)
#   SCENARIO_POD_CHECK   command run with "<namespace> <pod>" for every Pullman pod: the runtime
#                        proof of its security context, where the caller can see the node (optional)
#   SCENARIO_FIGURES     file the figures are appended to, as Markdown rows (optional)
#   SCENARIO_RESTART_APISERVER  shell command (run with bash -c) that restarts the cluster's API
#                        server, where the caller can (optional; without it, that step is skipped)
#   SCENARIO_NS, SCENARIO_DEMO_NS   release and executor namespaces (pullman-system, demo)
#   HELM                 helm binary (default helm); PULLMAN_BIN: pullman for the host steps
# Prints one line per check; on a failure, the pods' states and the last log lines of Pullman's pods,
# then exits 1.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
: "${SCENARIO_VALUES:?SCENARIO_VALUES: a values file for the chart}"
NS="${SCENARIO_NS:-pullman-system}"
DEMO="${SCENARIO_DEMO_NS:-demo}"
PLACEMENT="${SCENARIO_PLACEMENT:-{\}}"
JOB_IMAGE="${SCENARIO_IMAGE:-busybox:1.37}"
HELM="${HELM:-helm}"
PULLMAN="${PULLMAN_BIN:-$ROOT/target/debug/pullman}"
FIGURES="${SCENARIO_FIGURES:-/dev/null}"
RELEASE=pullman
WORK="$(mktemp -d /tmp/pullman-scenario.XXXXXX)"
PF_PID=""
STREAM=""
PROBE=""
cleanup() {
  set +e
  [[ -n "$PF_PID" ]] && kill "$PF_PID" 2>/dev/null
  [[ -n "$STREAM" ]] && kill "$STREAM" 2>/dev/null
  [[ -n "$PROBE" ]] && kill "$PROBE" 2>/dev/null
  [[ -n "${PHASE_WATCH:-}" ]] && { kill "$PHASE_WATCH"; pkill -f "get workorders -n $DEMO -w"; } 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

SUITE=scenario
# shellcheck source=e2e/lib/check.sh
source "$ROOT/e2e/lib/check.sh"
figure() { echo "| $1 | $2 |" >> "$FIGURES"; echo "    figure: $1 = $2"; }
diagnose() {
  echo "---- WorkOrders" >&2
  k get workorders -n "$DEMO" 2>&1 | grep -v ' Succeeded ' >&2 || true
  echo "---- pods" >&2
  k get pods -A -o wide 2>&1 | grep -v '^kube-system' >&2 || true
  # An evicted pod or a node under pressure is the machine's trouble (a full disk, memory), not
  # Pullman's: say so before the pods' logs.
  echo "---- node conditions, and this machine's disk" >&2
  k get nodes -o jsonpath='{range .items[*]}{.metadata.name}{":"}{range .status.conditions[*]}{" "}{.type}{"="}{.status}{end}{"\n"}{end}' >&2 || true
  df -h "$ROOT" /tmp >&2 || true
  local p
  for p in $(k get pods -n "$NS" -o name 2>/dev/null) $(k get pods -n "$DEMO" -l app.kubernetes.io/name=pullman-executor -o name 2>/dev/null); do
    local ns="$NS"; k get -n "$NS" "$p" >/dev/null 2>&1 || ns="$DEMO"
    echo "---- $ns/${p#pod/}: last log lines" >&2
    k logs -n "$ns" "$p" --all-containers --tail=15 2>&1 | sed 's/^/    /' >&2 || true
    k logs -n "$ns" "$p" --all-containers --previous --tail=15 2>/dev/null | sed 's/^/    (previous) /' >&2 || true
  done
}
# A Pullman pod that cannot start, keeps crashing or was evicted, in one line ("<ns>/<pod>
# <container>: <reason>: <message>"): waiting on it would only end in a timeout. The pod lists go
# through files: with dozens of evicted pods their JSON outgrows one command-line argument.
pod_trouble() {
  k get pods -n "$NS" -o json >"$WORK/pods-release.json" 2>/dev/null || echo '{}' >"$WORK/pods-release.json"
  k get pods -n "$DEMO" -l app.kubernetes.io/name=pullman-executor -o json >"$WORK/pods-executor.json" 2>/dev/null \
    || echo '{}' >"$WORK/pods-executor.json"
  python3 - "$WORK/pods-release.json" "$WORK/pods-executor.json" <<'PY'
import json, sys
bad = {"ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CrashLoopBackOff",
       "CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
for path in sys.argv[1:]:
    for p in json.load(open(path)).get("items", []):
        where = "%s/%s" % (p["metadata"]["namespace"], p["metadata"]["name"])
        status = p.get("status", {})
        if status.get("reason") == "Evicted":
            print("%s: Evicted: %s" % (where, status.get("message", "")))
            sys.exit(0)
        for c in status.get("containerStatuses", []) + status.get("initContainerStatuses", []):
            w = c.get("state", {}).get("waiting") or {}
            if w.get("reason") in bad:
                print("%s %s: %s: %s" % (where, c["name"], w["reason"], w.get("message", "")))
                sys.exit(0)
PY
}
# until_true <seconds> <what> <command...>: polls every 0.5 s; fails naming <what>, or at once
# when a Pullman pod cannot start (pod_trouble).
until_true() {
  local secs="$1" what="$2" end trouble; shift 2
  end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    (( SECONDS < end )) || fail "$what: not within ${secs}s"
    trouble="$(pod_trouble || true)"
    [[ -z "$trouble" ]] || fail "$what: $trouble"
    sleep 0.5
  done
}
now() { date +%s.%N; }
since() { awk -v a="$(now)" -v b="$1" 'BEGIN { printf "%.1f", a - b }'; }
# Seconds from a pod's creation to its Ready condition (the kubelet's own timestamps).
pod_start_to_ready() {
  k get -n "$1" pod "$2" -o json | python3 -c '
import json, sys, datetime
p = json.load(sys.stdin)
t = lambda s: datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))
ready = [c for c in p["status"]["conditions"] if c["type"] == "Ready"][0]["lastTransitionTime"]
print(int((t(ready) - t(p["metadata"]["creationTimestamp"])).total_seconds()))'
}
# A WorkOrder whose Job runs `script` in a real container (restartPolicy Never, backoffLimit 0).
job_order() { # job_order <name> <script> [claimTimeoutSeconds]
  python3 - "$1" "$2" "${3:-600}" "$PLACEMENT" "$JOB_IMAGE" <<'PY'
import json, sys
name, script, timeout, placement, image = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5]
pod = {"restartPolicy": "Never",
       "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "seccompProfile": {"type": "RuntimeDefault"}},
       "containers": [{"name": "main", "image": image, "imagePullPolicy": "IfNotPresent",
                       "args": ["sh", "-c", script],
                       "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                           "capabilities": {"drop": ["ALL"]}}}]}
pod.update(placement)
job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
       "spec": {"backoffLimit": 0, "template": {"spec": pod}}}
print(json.dumps({"apiVersion": "pullman.dev/v1alpha1", "kind": "WorkOrder", "metadata": {"name": name},
                  "spec": {"workType": "custom", "claimTimeoutSeconds": timeout, "maxRetries": 0,
                           "targeting": {"labels": ["demo"]}, "yamlContent": json.dumps(job)}}))
PY
}
configmap_order() { # configmap_order <name>
  python3 - "$1" <<'PY'
import json, sys
cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": sys.argv[1]}, "data": {"k": "v"}}
print(json.dumps({"apiVersion": "pullman.dev/v1alpha1", "kind": "WorkOrder", "metadata": {"name": sys.argv[1]},
                  "spec": {"workType": "custom", "targeting": {"labels": ["demo"]}, "yamlContent": json.dumps(cm)}}))
PY
}
phase() { k get -n "$DEMO" workorder "$1" -o jsonpath='{.status.phase}' 2>/dev/null; }
has_phase() { [[ "$(phase "$1")" == "$2" ]]; }
leader() { k get -n "$NS" lease "$RELEASE-leader" -o jsonpath='{.spec.holderIdentity}' 2>/dev/null; }
SERVE_PODS="app.kubernetes.io/component=server,app.kubernetes.io/instance=$RELEASE"
serve_pods() { k get pods -n "$NS" -l "$SERVE_PODS" -o jsonpath='{range .items[?(@.status.phase=="Running")]}{.metadata.name}{"\n"}{end}'; }
# The executor's pod that is not being deleted.
executor_pod() { k get pods -n "$DEMO" -l pullman.dev/executor=demo -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{"\n"}{end}' | awk 'NF == 1 { print $1; exit }'; }
pct() { # pct <p> <numbers...>: nearest-rank percentile
  printf '%s\n' "${@:2}" | sort -n | awk -v p="$1" '{ a[NR] = $1 } END { i = int((p / 100) * NR + 0.999); if (i < 1) i = 1; print a[i] }'
}
# Every WorkOrder phase change in the demo namespace, as "<seconds since epoch> <name> <phase>",
# from a watch: apply→Succeeded is measured to the moment the change is seen, not to status
# timestamps, which are whole seconds.
start_phase_watch() {
  kubectl get workorders -n "$DEMO" -w -o jsonpath='{.metadata.name} {.status.phase}{"\n"}' 2>/dev/null |
    while read -r name ph; do echo "$(now) $name $ph"; done > "$WORK/phases.log" &
  PHASE_WATCH=$!
}
seen_at() { awk -v n="$1" -v p="$2" '$2 == n && $3 == p { print $1; exit }' "$WORK/phases.log"; }
# --- 1. install ---------------------------------------------------------------------------------
step "install the chart (restricted namespaces, 2 serve replicas, an Executor in values)"
for n in "$NS" "$DEMO"; do
  k create namespace "$n" --dry-run=client -o yaml | k apply -f - >/dev/null
  k label --overwrite namespace "$n" pod-security.kubernetes.io/enforce=restricted >/dev/null
done
cat > "$WORK/scenario-values.yaml" <<YAML
server:
  replicas: 2
executors:
  - name: demo
    namespace: $DEMO
    labels: [demo]
    workTypes: [custom]
    maxConcurrency: 8
    leaseSeconds: 15
    nodeSelector: $(python3 -c 'import json,sys; print(json.dumps(json.loads(sys.argv[1]).get("nodeSelector", {})))' "$PLACEMENT")
    tolerations: $(python3 -c 'import json,sys; print(json.dumps(json.loads(sys.argv[1]).get("tolerations", [])))' "$PLACEMENT")
    rules:
      - {apiGroups: [batch], resources: [jobs], verbs: [get, list, watch, create, patch, delete, deletecollection]}
      - {apiGroups: [""], resources: [configmaps], verbs: [get, list, watch, create, patch, delete, deletecollection]}
YAML
t_install=$(now)
# Without --wait: our own wait says at once when a pod cannot start (missing image, crash loop).
"$HELM" upgrade --install "$RELEASE" charts/pullman -n "$NS" -f "$SCENARIO_VALUES" -f "$WORK/scenario-values.yaml" \
  >/dev/null || fail "helm install"
serve_available() { [[ "$(k get deploy -n "$NS" "$RELEASE" -o jsonpath='{.status.availableReplicas}')" == 2 ]]; }
until_true 300 "Deployment $NS/$RELEASE available with 2 replicas" serve_available
k get -n "$DEMO" executor demo >/dev/null 2>&1 || fail "the first helm install did not create the Executor demo"
ok "helm install (the Executor in values created by it), serve available ($(since "$t_install")s)"
mapfile -t SERVE < <(serve_pods)
(( ${#SERVE[@]} == 2 )) || fail "expected 2 serve pods Running, found ${#SERVE[@]}: ${SERVE[*]}"
until_true 60 "both serve pods Ready" k wait -n "$NS" --for=condition=Ready "pod/${SERVE[0]}" "pod/${SERVE[1]}" --timeout=5s
ok "serve: 2 replicas Running and Ready (${SERVE[*]})"
figure "serve pod start → Ready (s)" "$(pod_start_to_ready "$NS" "${SERVE[0]}"), $(pod_start_to_ready "$NS" "${SERVE[1]}")"

has_leader() { [[ -n "$(leader)" ]]; }
until_true 60 "a serve replica holding the Lease $RELEASE-leader" has_leader
holder="$(leader)"
n=0; for p in "${SERVE[@]}"; do [[ "$holder" == "$p"-* ]] && n=$((n + 1)); done
(( n == 1 )) || fail "Lease holder $holder is not exactly one of ${SERVE[*]}"
leaders=0
for p in "${SERVE[@]}"; do
  k logs -n "$NS" "$p" > "$WORK/$p.log" || fail "kubectl logs $p"
  grep -q "became leader" "$WORK/$p.log" && leaders=$((leaders + 1))
done
(( leaders == 1 )) || fail "$leaders serve replicas say they became leader"
ok "exactly one replica holds the Lease and reconciles ($holder)"

"$HELM" test "$RELEASE" -n "$NS" --timeout 3m >/dev/null || fail "helm test"
ok "helm test (GET /readyz through the Service from a pod)"

until_true 180 "Executor $DEMO/demo Ready" k wait -n "$DEMO" --for=condition=Ready executor/demo --timeout=5s
EXEC="$(executor_pod)"
[[ -n "$EXEC" ]] || fail "no executor pod"
until_true 60 "executor pod Ready" k wait -n "$DEMO" --for=condition=Ready "pod/$EXEC" --timeout=5s
ok "Executor demo Ready; its Deployment's pod $EXEC Running and Ready"
figure "executor pod start → Ready (s)" "$(pod_start_to_ready "$DEMO" "$EXEC")"

if [[ -n "${SCENARIO_POD_CHECK:-}" ]]; then
  for p in "${SERVE[@]}"; do "$SCENARIO_POD_CHECK" "$NS" "$p" || fail "runtime check of $NS/$p"; done
  "$SCENARIO_POD_CHECK" "$DEMO" "$EXEC" || fail "runtime check of $DEMO/$EXEC"
  ok "at run time, every Pullman container runs as 65532 on a read-only root file system"
fi

# --- 2. real Jobs -------------------------------------------------------------------------------
step "WorkOrders with real containers"
job_order hello 'echo hello from a real container' | k apply -n "$DEMO" -f - >/dev/null
until_true 120 "WorkOrder hello Succeeded" has_phase hello Succeeded
[[ "$(k logs -n "$DEMO" job/hello 2>/dev/null)" == "hello from a real container" ]] || fail "Job hello's container did not print its line"
ok "a Job's container printed its line and exited 0 → WorkOrder Succeeded"

job_order seven 'echo about to fail; exit 7' | k apply -n "$DEMO" -f - >/dev/null
until_true 120 "WorkOrder seven Failed" has_phase seven Failed
msg="$(k get -n "$DEMO" workorder seven -o jsonpath='{.status.message}')"
seven_pod="$(k get pods -n "$DEMO" -l batch.kubernetes.io/job-name=seven -o jsonpath='{.items[0].metadata.name}')"
[[ "$msg" == *"pod $seven_pod container main exited with code 7"* ]] || fail "the Failed message does not name pod $seven_pod, container main and code 7: $msg"
ok "a container exiting 7 → WorkOrder Failed: $msg"

# --- 3. figures: 20 real Jobs against 20 ConfigMaps, one run --------------------------------------
step "apply→Succeeded: 20 WorkOrders with a real Job, 20 with a ConfigMap, alternating"
start_phase_watch
# The watch lists what exists first: once a line is in, later changes are seen.
watch_started() { [[ -s "$WORK/phases.log" ]]; }
until_true 30 "the WorkOrder watch started" watch_started
declare -A applied
for i in $(seq -w 1 20); do
  job_order "job-$i" 'echo run' > "$WORK/job-$i.json"
  configmap_order "cm-$i" > "$WORK/cm-$i.json"
done
for i in $(seq -w 1 20); do
  for n in "job-$i" "cm-$i"; do applied[$n]=$(now); k apply -n "$DEMO" -f "$WORK/$n.json" >/dev/null; done
done
all_done() { local i; for i in $(seq -w 1 20); do has_phase "job-$i" Succeeded && has_phase "cm-$i" Succeeded || return 1; done; }
until_true 300 "all 40 WorkOrders Succeeded" all_done
watch_saw_all() { local i; for i in $(seq -w 1 20); do [[ -n "$(seen_at "job-$i" Succeeded)" && -n "$(seen_at "cm-$i" Succeeded)" ]] || return 1; done; }
until_true 30 "the watch seeing all 40 Succeeded" watch_saw_all
{ kill "$PHASE_WATCH"; pkill -f "get workorders -n $DEMO -w"; } 2>/dev/null || true
PHASE_WATCH=""
jobs=(); cms=()
for i in $(seq -w 1 20); do
  for n in "job-$i" "cm-$i"; do
    t="$(seen_at "$n" Succeeded)"; [[ -n "$t" ]] || fail "the watch did not see $n Succeeded"
    d="$(awk -v a="$t" -v b="${applied[$n]}" 'BEGIN { printf "%.2f", a - b }')"
    if [[ "$n" == job-* ]]; then jobs+=("$d"); else cms+=("$d"); fi
  done
done
ok "40 WorkOrders Succeeded"
figure "apply→Succeeded, real Job, p50 / p99 (s)" "$(pct 50 "${jobs[@]}") / $(pct 99 "${jobs[@]}")"
figure "apply→Succeeded, ConfigMap, p50 / p99 (s)" "$(pct 50 "${cms[@]}") / $(pct 99 "${cms[@]}")"

# --- 4. memory as the kubelet reports it --------------------------------------------------------
mem() { # mem <namespace> <pod>: working set in MiB, from the kubelet's summary API
  local node
  node="$(k get -n "$1" pod "$2" -o jsonpath='{.spec.nodeName}')"
  k get --raw "/api/v1/nodes/$node/proxy/stats/summary" | python3 -c '
import json, sys
s = json.load(sys.stdin)
for p in s.get("pods", []):
    if p["podRef"]["namespace"] == sys.argv[1] and p["podRef"]["name"] == sys.argv[2]:
        print("%.1f" % (sum(c.get("memory", {}).get("workingSetBytes", 0) for c in p.get("containers", [])) / 2**20))' "$1" "$2"
}
figure "serve memory, working set (MiB)" "$(mem "$NS" "${SERVE[0]}"), $(mem "$NS" "${SERVE[1]}")"
figure "executor memory, working set (MiB)" "$(mem "$DEMO" "$EXEC")"

# --- 5. leader takeover -------------------------------------------------------------------------
step "delete the leader's pod: the other replica takes over; WorkOrders keep reconciling"
old="$(leader)"; old_pod="${old%-*}"
t_del=$(now)
k delete pod -n "$NS" "$old_pod" --wait=false >/dev/null
configmap_order during-takeover | k apply -n "$DEMO" -f - >/dev/null
new_leader() { local h; h="$(leader)"; [[ -n "$h" && "$h" != "$old" ]]; }
until_true 120 "a new Lease holder after deleting $old_pod" new_leader
takeover="$(since "$t_del")"
[[ "$(leader)" != "$old_pod"-* ]] || fail "the deleted pod $old_pod holds the Lease again"
until_true 120 "WorkOrder during-takeover Succeeded" has_phase during-takeover Succeeded
ok "$(leader) took over in ${takeover}s; a WorkOrder applied meanwhile Succeeded"
figure "leader takeover after deleting the leader's pod (s)" "$takeover"

# --- 6. the executor's pod deleted while it carries an order ------------------------------------
step "delete the executor's pod while its order's Job runs for a minute"
EXEC="$(executor_pod)"
job_order long 'echo start; sleep 60; echo done' 3600 | k apply -n "$DEMO" -f - >/dev/null
until_true 60 "WorkOrder long Claimed" has_phase long Claimed
long_running() { [[ -n "$(k get pods -n "$DEMO" -l batch.kubernetes.io/job-name=long --field-selector=status.phase=Running -o name)" ]]; }
until_true 60 "Job long running" long_running
# Its log, followed before the delete: the pod's logs go with it.
kubectl logs -f -n "$DEMO" "$EXEC" > "$WORK/executor.log" 2>&1 &
FOLLOW=$!
sleep 1
t_del=$(now)
k delete pod -n "$DEMO" "$EXEC" --wait=false >/dev/null
gone() { ! k get pod -n "$DEMO" "$EXEC" >/dev/null 2>&1; }
grace="$(k get deploy -n "$DEMO" demo-executor -o jsonpath='{.spec.template.spec.terminationGracePeriodSeconds}')"
until_true $((grace + 15)) "executor pod $EXEC gone" gone
exited="$(since "$t_del")"
wait "$FOLLOW" 2>/dev/null || true
# It ended on its own, by its drain limit, not by the kubelet's SIGKILL at the grace period.
awk -v e="$exited" -v g="$grace" 'BEGIN { exit !(e < g) }' || fail "the executor's pod took ${exited}s to go, not less than its ${grace}s grace period"
grep -q "abandoning them to the reaper" "$WORK/executor.log" \
  || { tail -n 5 "$WORK/executor.log" >&2; fail "the executor did not abandon its order at its drain limit"; }
grep -q "executor stopped" "$WORK/executor.log" \
  || { tail -n 5 "$WORK/executor.log" >&2; fail "the executor did not stop on its own before SIGKILL"; }
# Reclaimed by the reaper when the abandoned claim's 15 s lease ends, then finished by the new pod
# watching the same Job: long before the order's claim timeout of an hour.
until_true 150 "WorkOrder long Succeeded after its executor's pod was deleted" has_phase long Succeeded
reclaims="$(k get -n "$DEMO" workorder long -o jsonpath='{.status.reclaimCount}')"
ok "the pod stopped in ${exited}s of a ${grace}s grace period; the order was handed out again (reclaims: ${reclaims:-0}) and Succeeded $(since "$t_del")s after the delete"
figure "executor pod deleted mid-order: pod gone / order Succeeded (s)" "$exited / $(since "$t_del")"

serve_url() {
  # Sets URL in this shell (a port-forward started in a $(...) subshell could not be stopped).
  if [[ "${SCENARIO_SERVE_URL:-port-forward}" == service ]]; then
    URL="http://$(k get svc -n "$NS" "$RELEASE" -o jsonpath='{.spec.clusterIP}'):8080"
  else
    local port
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    kubectl port-forward -n "$NS" "svc/$RELEASE" "$port:8080" >/dev/null 2>&1 & PF_PID=$!
    URL="http://127.0.0.1:$port"
    until_true 30 "port-forward to serve" curl -fsS "$URL/healthz"
  fi
}

# --- 7. rollout restart of serve during 200 WorkOrders -------------------------------------------
step "kubectl rollout restart of serve during a stream of 200 WorkOrders"
admin_token="$(k get secret -n "$NS" "$RELEASE-admin-token" -o jsonpath='{.data.token}' | base64 -d)"
for i in $(seq -w 1 200); do configmap_order "stream-$i" > "$WORK/stream-$i.json"; done
# Applied one by one, the restart started after the first 20.
( for i in $(seq -w 1 200); do k apply -n "$DEMO" -f "$WORK/stream-$i.json" >/dev/null || exit 1; done ) &
STREAM=$!
streamed_20() { (( $(k get -n "$DEMO" workorders -o name | grep -c stream-) >= 20 )); }
until_true 60 "the first 20 streamed WorkOrders applied" streamed_20
# Where this machine reaches serve through its Service (ClusterIP), a client asks it every 50 ms
# from the restart until the old pods are gone and 5 s more: none may be refused or time out.
# (A port-forward is pinned to one pod and would measure that pod only.)
if [[ "${SCENARIO_SERVE_URL:-port-forward}" == service ]]; then
  serve_url
  python3 - "$URL/healthz" "$WORK/probe.stop" > "$WORK/probe.out" <<'PY' & PROBE=$!
import os, sys, time, urllib.request
url, stop = sys.argv[1], sys.argv[2]
n, failed, t0 = 0, [], time.monotonic()
while not os.path.exists(stop):
    n += 1
    try:
        urllib.request.urlopen(url, timeout=3).read()
    except Exception as e:
        failed.append(f"{time.monotonic() - t0:.1f}s: {e}")
    time.sleep(0.05)
print(n, len(failed))
for f in failed[:10]:
    print(f)
PY
fi
k rollout restart -n "$NS" deployment/"$RELEASE" >/dev/null
wait "$STREAM" || fail "applying the stream of WorkOrders"
STREAM=""
k rollout status -n "$NS" deployment/"$RELEASE" --timeout=180s >/dev/null || fail "rollout restart did not finish"
replicas="$(k get deployment -n "$NS" "$RELEASE" -o jsonpath='{.spec.replicas}')"
old_pods_gone() { [[ "$(k get pods -n "$NS" -l "$SERVE_PODS" -o name | wc -l)" == "$replicas" ]]; }
until_true 60 "the serve pods from before the restart gone" old_pods_gone
if [[ -n "$PROBE" ]]; then
  sleep 5
  touch "$WORK/probe.stop"
  wait "$PROBE" || fail "the client asking serve through its Service during the restart"
  PROBE=""
  read -r probed probe_failed < "$WORK/probe.out"
  figure "requests through the Service during the rollout restart: sent / refused or timed out" "$probed / $probe_failed"
  (( probe_failed == 0 )) || { tail -n +2 "$WORK/probe.out" >&2; fail "$probe_failed of $probed requests through the Service failed during the rollout restart"; }
  ok "$probed requests through the Service during the restart, every one answered"
fi
stream_done() { [[ "$(k get -n "$DEMO" workorders -o jsonpath='{range .items[*]}{.metadata.name}={.status.phase}{"\n"}{end}' | grep -c '^stream-.*=Succeeded$')" == 200 ]]; }
until_true 300 "200 streamed WorkOrders Succeeded" stream_done
ok "200 WorkOrders Succeeded across the restart"
serve_url
ids="$(k get -n "$DEMO" workorders -o jsonpath='{range .items[*]}{.metadata.name} {.status.workOrderId}{"\n"}{end}' | awk '$1 ~ /^stream-/ { print $2 }')"
python3 - "$URL" "$admin_token" $ids <<'PY' || fail "a streamed order was lost or completed twice"
import json, sys, urllib.request
url, token, ids = sys.argv[1], sys.argv[2], sys.argv[3:]
assert len(ids) == 200, f"{len(ids)} ids"
bad = []
for i in ids:
    req = urllib.request.Request(f"{url}/api/v1/work-order-log/{i}", headers={"Authorization": f"Bearer {token}"})
    entry = json.load(urllib.request.urlopen(req, timeout=10))
    won = [a for a in entry.get("attempts", []) if a.get("result") == "succeeded"]
    if entry.get("outcome") != "succeeded" or len(won) != 1:
        bad.append((i, entry.get("outcome"), len(won)))
if bad:
    print("not exactly once:", bad[:5], file=sys.stderr); sys.exit(1)
PY
ok "each of the 200 is in the log once, succeeded by exactly one attempt"

# --- 8. a worker on this machine ----------------------------------------------------------------
step "pullman worker on this machine reaches serve through its Service"
export PULLMAN_SERVER="$URL" PULLMAN_ADMIN_TOKEN="$admin_token"
"$PULLMAN" agents create --name "host-$RANDOM" --label host --token-out "$WORK/host.token" >/dev/null || fail "agents create through $URL"
printf 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: from-host}\n' > "$WORK/order.yaml"
wid="$("$PULLMAN" work-orders create -f "$WORK/order.yaml" --label host -o name)" || fail "work-orders create through $URL"
rc=0
"$PULLMAN" worker --server "$URL" --token-file "$WORK/host.token" --once --wait 30 --exec 'echo handled on the host' >"$WORK/worker.log" 2>&1 || rc=$?
(( rc == 0 )) || { cat "$WORK/worker.log" >&2; fail "pullman worker --once exited $rc"; }
"$PULLMAN" work-orders wait "$wid" --timeout 30s >/dev/null || fail "the host worker's order did not succeed"
ok "the host's worker completed order ${wid:0:8} through $URL"

# --- 9. the containers' output ------------------------------------------------------------------
step "the containers' output: followed while the Job runs, kept after its pod is gone"
order_id() { k get -n "$DEMO" workorder "$1" -o jsonpath='{.status.workOrderId}'; }
# A line counted by its text after the `[pod/container] ` prefix the CLI prints.
count_text() { awk -v t="$2" 'index($0, "] " t) && substr($0, index($0, "] ") + 2) == t { n++ } END { print n + 0 }' "$1"; }
job_order ticker 'for i in 1 2 3 4 5 6 7 8 9 10; do echo tick $i; sleep 1; done' | k apply -n "$DEMO" -f - >/dev/null
has_id() { [[ -n "$(order_id ticker)" ]]; }
until_true 60 "WorkOrder ticker has its order id" has_id
"$PULLMAN" work-orders logs "$(order_id ticker)" -f > "$WORK/ticker.out" 2>"$WORK/ticker.err" & FOLLOW=$!
first_tick() { grep -q "tick 1\$" "$WORK/ticker.out"; }
until_true 60 "the first line of ticker followed" first_tick
[[ "$(phase ticker)" != Succeeded ]] || fail "ticker had already Succeeded when its first line arrived: not followed live"
rc=0; wait "$FOLLOW" || rc=$?
(( rc == 0 )) || { cat "$WORK/ticker.err" >&2; fail "logs -f of ticker exited $rc, not 0 (succeeded)"; }
for i in 1 2 3 4 5 6 7 8 9 10; do
  (( $(count_text "$WORK/ticker.out" "tick $i") == 1 )) || { cat "$WORK/ticker.out" >&2; fail "tick $i is not in the followed output exactly once"; }
done
grep -q '^\[ticker-[a-z0-9]*/main\] tick 1$' "$WORK/ticker.out" || { head -n 3 "$WORK/ticker.out" >&2; fail "ticker's lines do not name their pod and container"; }
ok "logs -f showed ticker's 10 lines while its Job ran, each once, [pod/container] first, and exited 0 with it"

"$PULLMAN" work-orders logs "$(order_id hello)" > "$WORK/hello.out" || fail "work-orders logs hello"
k delete job -n "$DEMO" hello --cascade=foreground --wait=true --timeout=60s >/dev/null || fail "deleting Job hello"
hello_pods() { [[ -z "$(k get pods -n "$DEMO" -l batch.kubernetes.io/job-name=hello -o name)" ]]; }
until_true 60 "Job hello's pod gone" hello_pods
"$PULLMAN" work-orders logs "$(order_id hello)" > "$WORK/hello-after.out" || fail "work-orders logs hello after its pod was deleted"
(( $(count_text "$WORK/hello-after.out" "hello from a real container") == 1 )) || { cat "$WORK/hello-after.out" >&2; fail "hello's line is not in its output once its pod is gone"; }
cmp -s "$WORK/hello.out" "$WORK/hello-after.out" || fail "hello's output changed when its pod was deleted"
ok "hello's output outlives its Job and pod"

rc=0; "$PULLMAN" work-orders logs "$(order_id seven)" -f > "$WORK/seven.out" 2>/dev/null || rc=$?
(( rc == 3 )) || fail "logs -f of the failed order seven exited $rc, not 3 (failed)"
(( $(count_text "$WORK/seven.out" "about to fail") == 1 )) || { cat "$WORK/seven.out" >&2; fail "seven's output lacks its line"; }
ok "logs -f of the failed order seven printed its line and exited 3"

# A container restarted in its pod (restartPolicy OnFailure): both runs are in the output.
job_order twice 'if [ -f /w/ran ]; then echo second run; else touch /w/ran; echo first run; exit 1; fi' \
  | python3 -c '
import json, sys
wo = json.load(sys.stdin)
job = json.loads(wo["spec"]["yamlContent"])
job["spec"]["backoffLimit"] = 2
pod = job["spec"]["template"]["spec"]
pod["restartPolicy"] = "OnFailure"
pod["volumes"] = [{"name": "w", "emptyDir": {}}]
pod["containers"][0]["volumeMounts"] = [{"name": "w", "mountPath": "/w"}]
wo["spec"]["yamlContent"] = json.dumps(job)
print(json.dumps(wo))' | k apply -n "$DEMO" -f - >/dev/null
until_true 120 "WorkOrder twice Succeeded" has_phase twice Succeeded
"$PULLMAN" work-orders logs "$(order_id twice)" > "$WORK/twice.out" || fail "work-orders logs twice"
for t in "first run" "second run"; do
  (( $(count_text "$WORK/twice.out" "$t") == 1 )) || { cat "$WORK/twice.out" >&2; fail "twice's '$t' is not in its output exactly once"; }
done
ok "a container restarted in its pod: the output has both of its runs, each line once"

# The executor's pod was deleted while long ran (step 6): the new pod re-attached to the same Job
# and sent only what the server did not have yet.
"$PULLMAN" work-orders logs "$(order_id long)" > "$WORK/long.out" || fail "work-orders logs long"
for t in start done; do
  (( $(count_text "$WORK/long.out" "$t") == 1 )) || { cat "$WORK/long.out" >&2; fail "long's line '$t' is not in its output exactly once across the executor's restart"; }
done
ok "long's output across its executor's restart: start and done, each once"

# Bytes a build log really holds: invalid UTF-8, and one 4 MiB line without a newline inside
# (under the kubelet's 10 MiB log rotation, which is not what this checks).
job_order odd "printf 'bad \\377\\376 bytes\\n'; head -c 4194304 /dev/zero | tr '\\000' a; echo; echo after" \
  | k apply -n "$DEMO" -f - >/dev/null
until_true 120 "WorkOrder odd Succeeded" has_phase odd Succeeded
"$PULLMAN" work-orders logs "$(order_id odd)" > "$WORK/odd.out" || fail "work-orders logs odd"
python3 - "$WORK/odd.out" <<'PY' || fail "odd's output is not what its container printed"
import sys
lines = [l.rstrip("\n").split("] ", 1)[1] for l in open(sys.argv[1], encoding="utf-8")]
assert lines[0] == "bad \ufffd\ufffd bytes", lines[:1]
assert lines[-1] == "after", lines[-1:]
pieces = lines[1:-1]
assert all(set(p) == {"a"} and len(p) <= 65536 for p in pieces), [len(p) for p in pieces][:5]
assert sum(map(len, pieces)) == 4 << 20, sum(map(len, pieces))
print(f"odd: {len(pieces)} pieces of at most 64 KiB, 4 MiB in all", file=sys.stderr)
PY
ok "invalid UTF-8 became U+FFFD and a 4 MiB line came in 64 KiB pieces; the stream went on to its last line"

# --- 10. why an order waits ---------------------------------------------------------------------
step "an order no agent can take says why; an Executor declared for it clears that and runs it"
schedulable() { k get -n "$DEMO" workorder "$1" -o jsonpath='{.status.conditions[?(@.type=="Schedulable")].status}/{.status.conditions[?(@.type=="Schedulable")].reason}' 2>/dev/null; }
job_order gpu-job 'echo ran where gpu agents run' \
  | python3 -c 'import json, sys; wo = json.load(sys.stdin); wo["spec"]["targeting"] = {"labels": ["gpu"]}; print(json.dumps(wo))' \
  | k apply -n "$DEMO" -f - >/dev/null
t_wait=$(now)
no_match() { [[ "$(schedulable gpu-job)" == False/NoMatchingAgent ]]; }
until_true 10 "WorkOrder gpu-job Schedulable=False (NoMatchingAgent)" no_match
unschedulable_event() { k get events -n "$DEMO" --field-selector involvedObject.name=gpu-job,reason=Unschedulable -o name | grep -q .; }
until_true 10 "an Unschedulable Event on WorkOrder gpu-job" unschedulable_event
[[ "$(phase gpu-job)" == Pending ]] || fail "gpu-job is $(phase gpu-job), not Pending"
ok "gpu-job: Schedulable=False (NoMatchingAgent) and its Event $(since "$t_wait") s after apply, still Pending"
# The chart's Executor under another name and label: same image, ServiceAccount and placement.
k get executor -n "$DEMO" demo -o json | python3 -c '
import json, sys
e = json.load(sys.stdin)
print(json.dumps({"apiVersion": e["apiVersion"], "kind": e["kind"],
                  "metadata": {"name": "gpu", "namespace": e["metadata"]["namespace"]},
                  "spec": dict(e["spec"], labels=["gpu"])}))' | k apply -f - >/dev/null
t_exec=$(now)
schedulable_now() { [[ "$(schedulable gpu-job)" == True/* ]]; }
until_true 90 "gpu-job schedulable once Executor gpu runs" schedulable_now
until_true 120 "WorkOrder gpu-job Succeeded" has_phase gpu-job Succeeded
ok "Executor gpu declared: gpu-job schedulable, then Succeeded $(since "$t_exec") s later"

# shellcheck source=e2e/scenario/faults.sh
source "$ROOT/e2e/scenario/faults.sh"

finish
