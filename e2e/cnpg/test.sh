#!/usr/bin/env bash
# Pullman through PostgreSQL failovers (issue #41): CloudNativePG on the real node (platform.sh),
# a Cluster of 3 instances with synchronous replication, and the fault suite (e2e/faults) against
# it: two `pullman serve` replicas on this machine, the Cluster's `-rw` Service as their
# DATABASE_URL (the `uri` of its `<cluster>-app` Secret, its host name replaced by the Service's
# address, which this machine reaches through kube-proxy but cannot resolve), AGENTS agents
# (default 50) claiming and completing ORDERS orders (default 10,000), while the primary's pod is
# deleted and then a switchover promotes a replica (failover.sh, the suite's failover hook).
# Checked by the suite, from the database and what the agents recorded: no order lost or
# completed twice, no acknowledged complete lost, every accepted complete with the logged
# claim_id, no 5xx but 503, concurrency keys never over their max. The write outage of each
# failover and the first claim after the new primary is ready are printed (and appended to
# PULLMAN_FIGURES if set): figures, not pass marks (bench/README.md).
# Then the chart, installed with the flags of charts/pullman/README.md's CloudNativePG section
# (whose Cluster platform.sh applied) on the Cluster's `<cluster>-app` Secret, with an Executor:
# `helm test`; a WorkOrder's Job; then the primary's pod deleted while a Job prints 40 lines that
# `pullman work-orders logs -f` follows from this machine and WorkOrders are applied: every line
# arrives once and in order, every WorkOrder succeeds, and no serve pod restarts; then a
# `pullman worker` on this machine completes an order through the chart's Service.
#
# Needs KUBECONFIG and PULLMAN_TESTENV_STATE of a test control plane with its real node
# (PULLMAN_TESTENV_REAL_NODE=1), Go, openssl, and the fault suite's binary (FAULTS_BIN, default the
# newest target/debug/deps/faults-*, built by `cargo test --test faults --no-run`: not run through
# cargo, which .ci/run is busy with in the background by then).
# Needs the pullman binary too (PULLMAN_BIN, default target/debug/pullman) for the image and the
# follower, and helm (e2e/chart/tools.sh). Leaves nothing behind: the operator stopped, the
# Cluster, the release, volumes, namespaces and CRDs deleted.
set -euo pipefail
cd "$(dirname "$0")/../.."
SUITE=cnpg
# shellcheck source=../lib/check.sh
. e2e/lib/check.sh
# shellcheck source=platform.sh
. e2e/cnpg/platform.sh
: "${KUBECONFIG:?KUBECONFIG must point at the test control plane (e2e/testenv/up.sh)}"
# shellcheck source=../lib/realnode.sh
. e2e/lib/realnode.sh
AGENTS="${AGENTS:-50}" ORDERS="${ORDERS:-10000}"
FAULTS="${FAULTS_BIN:-$(find target/debug/deps -maxdepth 1 -type f -executable -name 'faults-*' -printf '%T@ %p\n' 2>/dev/null | sort -n | tail -n 1 | cut -d' ' -f2 || true)}"
[[ -x "$FAULTS" ]] || fail "no fault suite binary (cargo test --test faults --no-run, or FAULTS_BIN)"

WORK="$(mktemp -d /tmp/pullman-cnpg.XXXXXX)"
diagnose() {
  echo "--- Cluster, pods"; k get cluster,pods -n "$CNPG_NS" -o wide || true
  echo "--- operator log (last 15 lines)"; tail -n 15 "$WORK/operator.log" 2>/dev/null | cut -c1-400 || true
}
FOLLOW=""
DEMO=""
RELEASE=""
cleanup() {
  set +e
  [[ -n "$FOLLOW" ]] && kill "$FOLLOW" 2>/dev/null
  # While serve runs: its controller takes its finalizers off the WorkOrders and the Executor,
  # which the namespace waits for; if serve is gone, they are taken off here.
  if [[ -n "$DEMO" ]] && ! kubectl delete namespace "$DEMO" --timeout=60s >/dev/null 2>&1; then
    for w in $(kubectl get workorders,executors -n "$DEMO" -o name 2>/dev/null); do
      kubectl patch -n "$DEMO" "$w" --type merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1
    done
  fi
  [[ -n "$RELEASE" ]] && "$HELM" uninstall pullman -n "$CNPG_NS" --timeout 60s >/dev/null 2>&1
  cnpg_down
  rm -rf "$WORK"
}
trap cleanup EXIT

cnpg_up "$WORK"
sync="$(k exec -n "$CNPG_NS" "$(cnpg_primary)" -c postgres -- psql -U postgres -Atc 'SHOW synchronous_standby_names')"
[[ "$sync" == "ANY 1 ("* ]] || fail "synchronous_standby_names is '$sync', not ANY 1 (…)"
ok "synchronous replication: $sync"

step "the fault suite: $AGENTS agents, $ORDERS orders, the primary's pod deleted, then a switchover"
rw="$(k get service -n "$CNPG_NS" "$CNPG_CLUSTER-rw" -o jsonpath='{.spec.clusterIP}')"
uri="$(k get secret -n "$CNPG_NS" "$CNPG_CLUSTER-app" -o jsonpath='{.data.uri}' | base64 -d)"
[[ "$uri" == *"@$CNPG_CLUSTER-rw.$CNPG_NS:5432/"* ]] || fail "the app Secret's uri is not on $CNPG_CLUSTER-rw.$CNPG_NS:5432"
url="${uri/@$CNPG_CLUSTER-rw.$CNPG_NS:5432\//@$rw:5432/}"
export CNPG_NS CNPG_CLUSTER
if ! "$FAULTS" --database-url="$url" --failover-hook="$PWD/e2e/cnpg/failover.sh" \
  --agents="$AGENTS" --orders="$ORDERS" > "$WORK/faults.log" 2>&1; then
  sed -n '/^## Fault suite/,$p' "$WORK/faults.log" | head -80
  tail -n 5 "$WORK/faults.log"
  fail "the fault suite failed through the failovers (above)"
fi
grep -A4 '^| # | fault' "$WORK/faults.log"
grep -q '^PASS$' "$WORK/faults.log" || fail "the fault suite did not say PASS"
ok "nothing lost, nothing completed twice, no 5xx but 503, through both failovers"

# The figures: per failover, the longest stretch without a complete (the write outage as the
# agents saw it) and the first claim after the new primary was ready.
figures="$(python3 - "$WORK/faults.log" <<'PY'
import sys
rows = [l.split("|")[1:-1] for l in open(sys.argv[1]) if l.startswith("| ") and "failover:" in l]
for r in rows:
    c = [x.strip() for x in r]
    print(f"{c[1]}: new primary ready {c[2]}, longest without a complete {c[6]}, first claim after ready {c[7]}")
PY
)"
echo "$figures"
[[ "$(wc -l <<<"$figures")" == 2 ]] || fail "the fault suite's table has no two failover rows"
if [[ -n "${PULLMAN_FIGURES:-}" ]]; then
  sed 's/^/cnpg: /' <<<"$figures" >> "$PULLMAN_FIGURES"
fi

# --- the chart on the Cluster, as charts/pullman/README.md installs it ------------------------------
step "the chart as charts/pullman/README.md installs it, on the Cluster's $CNPG_CLUSTER-app Secret"
HELM="$(e2e/chart/tools.sh | tail -n 1)/helm"
[[ -x "$HELM" ]] || fail "no helm (e2e/chart/tools.sh)"
e2e/testenv/images.sh pullman "$PULLMAN" || fail "importing localhost/pullman:dev"
mapfile -t helm_args < <(e2e/cnpg/readme.py helm)
RELEASE_NAME=pullman-cnpg
(( ${#helm_args[@]} > 0 )) || fail "no helm install in charts/pullman/README.md"
DEMO=pullman-cnpg-demo
k create namespace "$DEMO" >/dev/null || fail "creating namespace $DEMO"
k label namespace "$DEMO" pod-security.kubernetes.io/enforce=restricted >/dev/null
REAL='{nodeSelector: {pullman.dev/node: real}, tolerations: [{key: pullman.dev/node, operator: Equal, value: real, effect: NoSchedule}]}'
cat > "$WORK/values.yaml" <<YAML
image: {repository: localhost/pullman, tag: dev, pullPolicy: Never}
# e2e/realnode's scenario left its release "pullman" installed, with cluster-wide roles named
# after it: another name for this one's objects.
fullnameOverride: $RELEASE_NAME
server:
  logFormat: text
  nodeSelector: {pullman.dev/node: real}
  tolerations: [{key: pullman.dev/node, operator: Equal, value: real, effect: NoSchedule}]
executors:
  - name: demo
    namespace: $DEMO
    labels: [demo]
    workTypes: [custom]
    leaseSeconds: 15
    nodeSelector: {pullman.dev/node: real}
    tolerations: [{key: pullman.dev/node, operator: Equal, value: real, effect: NoSchedule}]
    rules:
      - {apiGroups: [batch], resources: [jobs], verbs: [get, list, watch, create, patch, delete, deletecollection]}
tests: {image: localhost/busybox:dev}
YAML
RELEASE=pullman
"$HELM" install pullman charts/pullman "${helm_args[@]}" -f "$WORK/values.yaml" --timeout 5m >/dev/null \
  || fail "helm install pullman charts/pullman ${helm_args[*]}"
"$HELM" test pullman -n "$CNPG_NS" --timeout 3m >/dev/null || fail "helm test"
ok "helm install with the README's flags (${helm_args[*]}), then helm test"
until_true 180 "Executor $DEMO/demo Ready" k wait -n "$DEMO" --for=condition=Ready executor/demo --timeout=5s >/dev/null

# A WorkOrder whose Job (busybox on the real node) runs SCRIPT.
job_order() { # job_order NAME SCRIPT
  python3 - "$1" "$2" <<'PY'
import json, sys
name, script = sys.argv[1], sys.argv[2]
pod = {"restartPolicy": "Never", "nodeSelector": {"pullman.dev/node": "real"},
       "tolerations": [{"key": "pullman.dev/node", "operator": "Equal", "value": "real", "effect": "NoSchedule"}],
       "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "seccompProfile": {"type": "RuntimeDefault"}},
       "containers": [{"name": "main", "image": "localhost/busybox:dev", "args": ["sh", "-c", script],
                       "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                           "capabilities": {"drop": ["ALL"]}}}]}
job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
       "spec": {"backoffLimit": 0, "template": {"spec": pod}}}
print(json.dumps({"apiVersion": "pullman.dev/v1alpha1", "kind": "WorkOrder", "metadata": {"name": name},
                  "spec": {"workType": "custom", "maxRetries": 0, "targeting": {"labels": ["demo"]},
                           "yamlContent": json.dumps(job)}}))
PY
}
phase() { k get workorder -n "$DEMO" "$1" -o jsonpath='{.status.phase}' 2>/dev/null; }
succeeded() { [[ "$(phase "$1")" == Succeeded ]]; }
job_order hello 'echo hello through the failed-over Cluster' | k apply -n "$DEMO" -f - >/dev/null
until_true 120 "WorkOrder hello Succeeded" succeeded hello
ok "a WorkOrder's Job ran on the real node, its order kept in the Cluster"

step "a failover under the chart's pods: a Job's output followed live, WorkOrders applied meanwhile"
restarts() { k get pods -n "$1" -l "$2" -o jsonpath='{range .items[*]}{.status.containerStatuses[0].restartCount}{" "}{end}'; }
serve_restarts="$(restarts "$CNPG_NS" app.kubernetes.io/component=server,app.kubernetes.io/instance=pullman)"
URL="http://$(k get svc -n "$CNPG_NS" "$RELEASE_NAME" -o jsonpath='{.spec.clusterIP}'):8080"
export PULLMAN_SERVER="$URL"
PULLMAN_ADMIN_TOKEN="$(k get secret -n "$CNPG_NS" "$RELEASE_NAME-admin-token" -o jsonpath='{.data.token}' | base64 -d)"
export PULLMAN_ADMIN_TOKEN
job_order lines 'for i in $(seq 1 40); do echo "line $i"; sleep 0.5; done' | k apply -n "$DEMO" -f - >/dev/null
lines_id() { k get workorder -n "$DEMO" lines -o jsonpath='{.status.workOrderId}'; }
has_lines_id() { [[ -n "$(lines_id)" ]]; }
until_true 60 "WorkOrder lines has an order id" has_lines_id
wid="$(lines_id)"
timeout 300 "$PULLMAN" work-orders logs -f "$wid" > "$WORK/follow.log" 2>"$WORK/follow.err" &
FOLLOW=$!
sleep 4
e2e/cnpg/failover.sh delete 2>"$WORK/failover.log" || fail "the failover: $(cat "$WORK/failover.log")"
for i in 1 2 3 4 5; do job_order "after-$i" "echo after $i" | k apply -n "$DEMO" -f - >/dev/null; done
until_true 180 "WorkOrder lines Succeeded" succeeded lines
for i in 1 2 3 4 5; do until_true 120 "WorkOrder after-$i Succeeded" succeeded "after-$i"; done
follow_rc=0
wait "$FOLLOW" || follow_rc=$?
FOLLOW=""
(( follow_rc == 0 )) || fail "the follower exited $follow_rc ($(tail -n 3 "$WORK/follow.err"))"
# The CLI prints each line after its `[pod/container] `.
expected="$(seq 1 40 | sed 's/^/line /')"
got="$(sed -n 's/^\[lines-[a-z0-9]*\/main\] \(line [0-9]*\)$/\1/p' "$WORK/follow.log")"
[[ "$got" == "$expected" ]] \
  || fail "the follower did not get lines 1..40 once each, in order: $(wc -l <<<"$got") lines; first: $(head -n 3 "$WORK/follow.log")"
ok "$(cat "$WORK/failover.log" | sed 's/^failover.sh: //'); the follower got every line once, the WorkOrders after it Succeeded"
[[ "$(restarts "$CNPG_NS" app.kubernetes.io/component=server,app.kubernetes.io/instance=pullman)" == "$serve_restarts" ]] \
  || fail "a serve pod restarted through the failover: $(restarts "$CNPG_NS" app.kubernetes.io/component=server,app.kubernetes.io/instance=pullman)"
ok "no serve pod restarted (restart counts: $serve_restarts)"

step "pullman worker on this machine, through the chart's Service, after the failover"
"$PULLMAN" agents create --name host-worker --label host --token-out "$WORK/host.token" >/dev/null \
  || fail "pullman agents create through $URL"
printf 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: from-host}\n' > "$WORK/order.yaml"
hid="$("$PULLMAN" work-orders create -f "$WORK/order.yaml" --label host -o name)" \
  || fail "pullman work-orders create through $URL"
timeout 120 "$PULLMAN" worker --server "$URL" --token-file "$WORK/host.token" --once --wait 30 \
  --exec 'echo handled on the host' > "$WORK/worker.log" 2>&1 \
  || { cat "$WORK/worker.log" >&2; fail "pullman worker --once through $URL"; }
"$PULLMAN" work-orders wait "$hid" --timeout 30s >/dev/null || fail "the host worker's order ${hid:0:8} did not succeed"
ok "pullman worker on this machine completed order ${hid:0:8} through $URL"

finish
