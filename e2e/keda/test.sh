#!/usr/bin/env bash
# KEDA scales a chart-declared Executor's Deployment on its backlog (issue #25), proved with KEDA's
# own operator (built by build.sh from its Go module, run on this machine against the test control
# plane; its CRDs from the module), not a mock:
#   1. the chart renders the Executor `burst` with `keda.enabled` (ScaledObject, TriggerAuthentication);
#      a local `pullman serve` runs its controller, which registers the agent, writes the token
#      Secret and creates Deployment burst-executor;
#   2. backlog 0: KEDA scales the Deployment to 0;
#   3. 5 orders: KEDA's metrics-api scaler reads GET /api/v1/agents/me/backlog with the Executor's
#      token from the Secret, and scales the Deployment up; the orders run and succeed;
#   4. backlog 0 again: after the cooldown KEDA scales it back to 0;
#   5. 1 -> N (hpa.sh): 20 orders of 5-14 s Jobs; KEDA's HPA, reading the backlog through KEDA's
#      metrics API server (adapter.sh: cmd/adapter behind the API server's aggregation layer),
#      scales the Deployment to ceil(20 / 4) = 5 and back down while orders run; each order
#      succeeds in exactly one attempt.
# kwok nodes start no containers, so a stand-in kubelet here runs one `pullman executor` process
# per replica the Deployment asks for, with the Deployment's own arguments and the token from the
# Secret (its --token-file path mapped to a local file): the orders run in those processes. A
# replica removed gets SIGTERM, as from a kubelet, and drains.
#
# Needs: KUBECONFIG of the test control plane (e2e/testenv/up.sh), PULLMAN_BIN (default
# target/debug/pullman), Go, helm (e2e/testenv/build.sh with PULLMAN_TESTENV_HELM=1), PostgreSQL
# server binaries (serve's embedded PostgreSQL), curl, python3. Leaves nothing behind: its
# processes, namespace, cluster objects and KEDA's CRDs are removed on exit.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
: "${KUBECONFIG:?KUBECONFIG must point at the test control plane: eval \"\$(e2e/testenv/up.sh)\"}"
PULLMAN="${PULLMAN_BIN:-$ROOT/target/debug/pullman}"
[[ -x "$PULLMAN" ]] || { echo "keda/test.sh: $PULLMAN is not built (cargo build)" >&2; exit 1; }

SUITE=keda
# shellcheck source=e2e/lib/check.sh
source "$ROOT/e2e/lib/check.sh"

KEDA_BIN="$("$HERE/build.sh" | tail -n1)"
CRDS="$(cat "$KEDA_BIN/crds")"
HELM="$(PULLMAN_TESTENV_HELM=1 "$ROOT/e2e/testenv/build.sh" | tail -n1)/helm"

WORK="$(mktemp -d /tmp/pullman-keda.XXXXXX)"
chmod 0755 "$WORK"   # as root, serve's embedded PostgreSQL runs as `postgres` and must reach it
NS="keda-e2e-$(python3 -c 'import secrets; print(secrets.token_hex(3))')"
PIDS=()
declare -A EXECUTORS=()   # stand-in pod index -> pid
DRAINING=()               # stand-in pods sent SIGTERM, draining their orders
STARTED=0                 # stand-in pods started so far
GROUPS_=()                # process groups of the stand-in Job pods
cleanup() {
  local rc=$?
  if [[ $rc != 0 ]]; then
    for f in "$WORK"/*.log; do [[ -f "$f" ]] && { echo "--- tail of $f" >&2; tail -n 25 "$f" >&2; }; done
  fi
  # First the APIService: one that does not answer makes every later namespace deletion fail.
  k delete apiservice v1beta1.external.metrics.k8s.io --ignore-not-found --wait=true --timeout=30s >/dev/null 2>&1 || true
  if k get apiservice v1beta1.external.metrics.k8s.io >/dev/null 2>&1; then
    echo "keda/test.sh: WARNING: APIService v1beta1.external.metrics.k8s.io is still registered;" \
      "namespace deletions will fail until it is deleted" >&2
    if [[ $rc == 0 ]]; then rc=1; fi
  fi
  # Finalizers: KEDA's on its objects, the controller's on the Executor. Deleted while both run,
  # they remove their own; whatever is left once they are gone (one died early) is released here.
  local kinds=scaledobjects.keda.sh,scaledjobs.keda.sh,triggerauthentications.keda.sh,executors.pullman.dev r
  k -n "$NS" delete "$kinds" --all --wait=true --timeout=30s >/dev/null 2>&1 || true
  for p in "${GROUPS_[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
  for p in "${EXECUTORS[@]}" "${DRAINING[@]}" "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${EXECUTORS[@]}" "${DRAINING[@]}" "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$p" 2>/dev/null || true
  done
  for p in "${GROUPS_[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
  for r in $(k -n "$NS" get "$kinds" -o name 2>/dev/null); do
    k -n "$NS" patch "$r" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
  done
  k delete namespace "$NS" --wait=true --timeout=60s >/dev/null 2>&1 || true
  k delete -f "$CRDS" --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1 || true
  rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

until_true() { # until_true <seconds> <what> <command...>
  local limit=$1 what=$2 t0=$SECONDS; shift 2
  until "$@"; do
    (( SECONDS - t0 < limit )) || fail "$what: not within ${limit}s"
    sleep 0.5
  done
  ok "$what ($((SECONDS - t0))s)"
}

step "KEDA's CRDs from its module ($CRDS)"
k apply --server-side -f "$CRDS" >/dev/null
established() { [[ "$(k get crd "$1" -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null)" == True ]]; }
for crd in scaledobjects.keda.sh triggerauthentications.keda.sh; do
  until_true 60 "CRD $crd established" established "$crd"
done
k create namespace "$NS" >/dev/null

PORT="$(free_port)"
API="http://127.0.0.1:$PORT"
ADMIN="keda-admin-$(python3 -c 'import secrets; print(secrets.token_hex(24))')"
step "pullman serve with its controller for namespace $NS on $API"
PULLMAN_ADMIN_TOKEN="$ADMIN" RUST_LOG=info,kube_client=info "$PULLMAN" serve --controller on \
  --watch-namespace "$NS" --leader-election-namespace "$NS" --executor-server-url "$API" \
  --data-dir "$WORK/data" --listen "127.0.0.1:$PORT" --maintenance-interval-seconds 1 \
  > "$WORK/serve.log" 2>&1 &
PIDS+=("$!")
until_true 120 "pullman serve ready" curl -fs -o /dev/null "$API/readyz"

step "the chart's Executor burst with keda.enabled, rendered by helm and applied"
cat > "$WORK/values.yaml" <<YAML
database: {url: "postgres://unused@localhost/unused"}
server: {executorServerUrl: "$API"}
executors:
  - name: burst
    namespace: $NS
    labels: [keda-burst]
    workTypes: [custom]
    keda: {enabled: true, minReplicas: 0, maxReplicas: 8, targetValue: 4, pollingInterval: 1, cooldownPeriod: 5,
           scaleDownStabilizationSeconds: 0}
    rules:
      - {apiGroups: [""], resources: [configmaps], verbs: [get, create, patch]}
      - {apiGroups: [batch], resources: [jobs], verbs: [get, list, watch, create, patch, delete]}
YAML
"$HELM" template pullman "$ROOT/charts/pullman" -n "$NS" -f "$WORK/values.yaml" \
  --show-only templates/executors.yaml > "$WORK/executors.yaml"
grep -q '^kind: ScaledObject' "$WORK/executors.yaml" || fail "the chart rendered no ScaledObject"
k apply --server-side -f "$WORK/executors.yaml" >/dev/null
until_true 60 "Secret burst-agent-token and Deployment burst-executor created by the controller" \
  sh -c "kubectl -n $NS get secret burst-agent-token >/dev/null 2>&1 && kubectl -n $NS get deploy burst-executor >/dev/null 2>&1"
k -n "$NS" get secret burst-agent-token -o jsonpath='{.data.token}' | base64 -d > "$WORK/token"
chmod 600 "$WORK/token"

step "the KEDA operator ($KEDA_BIN/keda-operator), watching $NS"
mkdir -p "$WORK/certs"   # its gRPC metrics service (for the adapter) serves mutual TLS from it
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=keda-operator \
  -addext "subjectAltName=DNS:keda-operator,DNS:localhost,IP:127.0.0.1" \
  -keyout "$WORK/certs/tls.key" -out "$WORK/certs/tls.crt" >/dev/null 2>&1
cp "$WORK/certs/tls.crt" "$WORK/certs/ca.crt"
GRPC_PORT="$(free_port)"
WATCH_NAMESPACE="$NS" KEDA_CLUSTER_OBJECT_NAMESPACE="$NS" POD_NAMESPACE="$NS" \
  "$KEDA_BIN/keda-operator" --leader-elect=false --cert-dir "$WORK/certs" \
  --metrics-bind-address "127.0.0.1:$(free_port)" --health-probe-bind-address "127.0.0.1:$(free_port)" \
  --metrics-service-bind-address "127.0.0.1:$GRPC_PORT" --enable-webhook-patching=false \
  --enable-apiservice-patching=false --zap-log-level=info > "$WORK/keda.log" 2>&1 &
PIDS+=("$!")
KEDA_PID=$!

step "KEDA's metrics API server ($KEDA_BIN/keda-adapter) behind the aggregation layer"
# shellcheck source=e2e/keda/adapter.sh
source "$HERE/adapter.sh"

# The stand-in kubelet: one local `pullman executor` per replica the Deployment asks for, with the
# Deployment's arguments; each second it records the replicas KEDA set.
replicas() { k -n "$NS" get deploy burst-executor -o jsonpath='{.spec.replicas}'; }
mapfile -t ARGS < <(k -n "$NS" get deploy burst-executor -o jsonpath='{range .spec.template.spec.containers[0].args[*]}{@}{"\n"}{end}')
RUN=()
for a in "${ARGS[@]}"; do [[ "$a" == /var/run/pullman/token ]] && RUN+=("$WORK/token") || RUN+=("$a"); done
supervise() {
  local want have i
  want="$(replicas)" || return 0
  echo "$(date +%s) $want" >> "$WORK/replicas.txt"
  have=${#EXECUTORS[@]}
  for (( i = have; i < want; i++ )); do
    STARTED=$((STARTED + 1))   # a log per process: hpa.sh reads what each did after its SIGTERM
    RUST_LOG=info "$PULLMAN" "${RUN[@]}" > "$WORK/executor-$i.$STARTED.log" 2>&1 &
    EXECUTORS[$i]=$!
  done
  for (( i = have - 1; i >= want; i-- )); do
    kill -TERM "${EXECUTORS[$i]}" 2>/dev/null || true
    DRAINING+=("${EXECUTORS[$i]}")
    unset "EXECUTORS[$i]"
  done
}
watch_until() { # watch_until <seconds> <what> <command...>: supervise each second until command holds
  local limit=$1 what=$2 t0=$SECONDS; shift 2
  until supervise; "$@"; do
    kill -0 "$KEDA_PID" 2>/dev/null || fail "the KEDA operator exited"
    (( SECONDS - t0 < limit )) || fail "$what: not within ${limit}s (replicas $(replicas))"
    sleep 1
  done
  ok "$what ($((SECONDS - t0))s)"
}
backlog() { curl -fsS -H "Authorization: Bearer $(cat "$WORK/token")" "$API/api/v1/agents/me/backlog"; }
is_zero() { [[ "$(replicas)" == 0 ]]; }
is_up() { [[ "$(replicas)" -ge 1 ]]; }

watch_until 120 "backlog $(backlog): KEDA scales burst-executor to 0" is_zero
until_true 30 "KEDA made ScaledObject burst-executor Ready" \
  sh -c "[ \"\$(kubectl -n $NS get scaledobject burst-executor -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}')\" = True ]"

stays_zero() { local i; for i in 1 2 3 4 5; do supervise; is_zero || return 1; sleep 1; done; }
stays_zero || fail "burst-executor left 0 with an empty backlog: replicas $(replicas)"
ok "burst-executor stays at 0 while the backlog is empty (5s)"

# orders_state <id...>: "<finished> <bad>", bad naming each finished order that did not succeed in
# exactly one attempt.
orders_state() {
  python3 - "$API" "$ADMIN" "$@" <<'PY'
import json, sys, urllib.request, urllib.error
api, token, ids = sys.argv[1], sys.argv[2], sys.argv[3:]
done, bad = 0, []
for i in ids:
    req = urllib.request.Request(f"{api}/api/v1/work-order-log/{i}",
                                 headers={"Authorization": f"Bearer {token}"})
    try:
        e = json.load(urllib.request.urlopen(req, timeout=10))
    except urllib.error.HTTPError as err:
        if err.code == 404:
            continue
        raise
    done += 1
    results = [a["result"] for a in e.get("attempts") or []]
    if not e["success"] or results != ["succeeded"]:
        bad.append(f"{i}: success={e['success']} attempts={results} {e.get('message')!r}")
print(done, "; ".join(bad))
PY
}

# new_order LABEL YAML: a custom order for agents labelled LABEL that applies YAML (written as in a
# JSON string: \n, \"); prints its id.
new_order() {
  curl -fsS -X POST "$API/api/v1/work-orders" -H "Authorization: Bearer $ADMIN" \
    -H 'Content-Type: application/json' \
    -d "{\"work_type\":\"custom\",\"targeting\":{\"labels\":[\"$1\"]},\"yaml_content\":\"$2\"}" \
    | jsonf 'd["id"]'
}
step "5 orders for label keda-burst"
IDS=()
for i in 1 2 3 4 5; do
  IDS+=("$(new_order keda-burst "apiVersion: v1\\nkind: ConfigMap\\nmetadata:\\n  name: keda-order-$i\\ndata: {n: \\\"$i\\\"}\\n")")
done
step "backlog as KEDA reads it: $(backlog)"
watch_until 60 "KEDA scales burst-executor up from 0" is_up
# All of IDS finished, each a success in one attempt; one that finished otherwise fails the suite.
all_succeeded() {
  local state done bad
  state="$(orders_state "${IDS[@]}")" || return 1
  read -r done bad <<<"$state"
  [[ -z "$bad" ]] || fail "orders that did not succeed in one attempt: $bad"
  (( done == ${#IDS[@]} ))
}
watch_until 120 "the 5 orders succeeded" all_succeeded
for i in 1 2 3 4 5; do k -n "$NS" get configmap "keda-order-$i" >/dev/null || fail "ConfigMap keda-order-$i missing"; done
UID_="$(k -n "$NS" get executor burst -o jsonpath='{.metadata.uid}')"
for id in "${IDS[@]}"; do
  by="$(curl -fsS -H "Authorization: Bearer $ADMIN" "$API/api/v1/work-order-log/$id" | jsonf 'd["claimed_by"]')"
  [[ "$by" == "$UID_" ]] || fail "order $id was claimed by $by, not by the Executor's agent $UID_"
done
ok "their ConfigMaps exist; each was claimed by the Executor's agent (a stand-in executor process)"
watch_until 120 "backlog $(backlog): KEDA scales burst-executor back to 0" is_zero
sleep 3; supervise
is_zero || fail "burst-executor did not stay at 0"

# shellcheck source=e2e/keda/hpa.sh
source "$HERE/hpa.sh"

# --- docs/keda.md's ScaledJob recipe, as written there (namespace, server URL and token path
# adapted): one Job per waiting order, each running `pullman worker --once`. kwok completes Job pods
# without running them, so the stand-in kubelet runs each new Job's container script here.
step "docs/keda.md's ScaledJob recipe: agent ci-worker (label keda-ci), its token in Secret ci-worker-token"
curl -fsS -X POST "$API/api/v1/agents" -H "Authorization: Bearer $ADMIN" -H 'Content-Type: application/json' \
  -d '{"name":"ci-worker","labels":["keda-ci"]}' \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"], end="")' > "$WORK/ci-worker.token"
chmod 600 "$WORK/ci-worker.token"
k -n "$NS" create secret generic ci-worker-token --from-file=token="$WORK/ci-worker.token" >/dev/null
python3 - "$ROOT/docs/keda.md" "$NS" "$API" > "$WORK/scaledjob.yaml" <<'PY'
import re, sys
doc, ns, api = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
section = doc[doc.index("## External workers"):]
block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
block = block.replace("namespace: ci}", "namespace: %s}" % ns)
block = block.replace("http://pullman.pullman.svc:8080", api)
# Quicker than the recipe's 10 s, so the test is short; nothing else changes.
block = block.replace("pollingInterval: 10", "pollingInterval: 1")
print(block)
PY
grep -q "kind: ScaledJob" "$WORK/scaledjob.yaml" || fail "no ScaledJob in docs/keda.md"
k apply --server-side -f "$WORK/scaledjob.yaml" >/dev/null
printf '#!/bin/sh\ncat >/dev/null\necho "ran $PULLMAN_WORK_ORDER_ID"\n' > "$WORK/run-order.sh"
chmod +x "$WORK/run-order.sh"
declare -A JOBS=()
run_jobs() { # the stand-in kubelet: each new Job's script, run here once
  local j script
  for j in $(k -n "$NS" get jobs -l scaledjob.keda.sh/name=ci-worker -o name 2>/dev/null); do
    [[ -n "${JOBS[$j]:-}" ]] && continue
    # KEDA deletes finished Jobs past successfulJobsHistoryLimit; one may be gone already.
    script="$(k -n "$NS" get "$j" -o jsonpath='{.spec.template.spec.containers[0].args[0]}' 2>/dev/null)" || continue
    script="${script//\/var\/run\/pullman\/token/$WORK/ci-worker.token}"
    # Its own process group (setsid), so the clean-up stops the script and its worker together.
    (cd "$WORK" && PATH="$(dirname "$PULLMAN"):$PATH" exec setsid sh -c "$script") >> "$WORK/job-${j#job.batch/}.log" 2>&1 &
    JOBS[$j]=$!
    GROUPS_+=("$!")
  done
}
sleep 3; run_jobs
[[ ${#JOBS[@]} == 0 ]] || fail "ScaledJob ci-worker started ${#JOBS[@]} Jobs with an empty backlog"
ok "ScaledJob ci-worker: no Job while the backlog is empty (3s)"
CI_IDS=()
for i in 1 2 3 4 5; do
  CI_IDS+=("$(new_order keda-ci "apiVersion: v1\\nkind: ConfigMap\\nmetadata:\\n  name: ci-order-$i\\n")")
done
ci_done() {
  local id
  run_jobs
  for id in "${CI_IDS[@]}"; do
    [[ "$(curl -fsS -H "Authorization: Bearer $ADMIN" "$API/api/v1/work-order-log/$id" 2>/dev/null \
      | python3 -c 'import json,sys; e=json.load(sys.stdin); print(e["success"] and e["message"].startswith("ran "))' 2>/dev/null)" == True ]] || return 1
  done
}
until_true 90 "5 orders for keda-ci: KEDA started Jobs, their 'pullman worker --once' ran each order" ci_done
# Jobs KEDA created, as its operator logs them ("Created jobs", "Number of jobs": n).
jobs_created() {
  python3 - "$WORK/keda.log" <<'PY'
import json, sys
n = 0
for line in open(sys.argv[1]):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    if e.get("msg") == "Created jobs" and e.get("scaledJob.Name") == "ci-worker":
        n += e.get("Number of jobs", 0)
print(n)
PY
}
sleep 3   # polls already under way when the last order was claimed
created="$(jobs_created)"
for _ in 1 2 3 4 5; do run_jobs; sleep 1; done
[[ "$(jobs_created)" == "$created" ]] || fail "Jobs kept coming with an empty backlog: $created, then $(jobs_created)"
(( created >= 5 )) || fail "5 orders ran in $created Jobs"
# kwok ends a Job's pod at once, so KEDA never sees a Job pending or running and starts more than
# one per order until the workers have claimed them; the extra ones find no order (exit 5, which
# the recipe's script turns into success). On a real node a Job counts as pending until it runs.
ok "KEDA created $created Jobs for the 5 orders; none in the 5 s after the backlog was empty"

hpa="$(k -n "$NS" get hpa keda-hpa-burst-executor -o jsonpath='{.spec.minReplicas}-{.spec.maxReplicas} {.spec.metrics[0].external.metric.name} {.spec.metrics[0].external.target.averageValue}')"
ok "KEDA's HPA keda-hpa-burst-executor: replicas $hpa"
step "replicas KEDA set, as the stand-in kubelet saw them (seconds since start: replicas):"
awk 'NR == 1 { t0 = $1 } $2 != last { printf "  %3ds: %s\n", $1 - t0, $2; last = $2 }' "$WORK/replicas.txt" >&2
step "what the KEDA operator logged when it scaled:"
python3 - "$WORK/keda.log" >&2 <<'PY'
import json, sys
for line in open(sys.argv[1]):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    if e.get("logger") == "scaleexecutor" and "ScaleTarget" in e.get("msg", ""):
        counts = {k: v for k, v in e.items() if "Count" in k or "replica" in k.lower()}
        print(f"  {e['ts']} {e['msg']} {counts}")
PY
finish
