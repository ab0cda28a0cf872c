#!/usr/bin/env bash
# `build` work orders with real Shipwright BuildRuns on the real node (issue #38, docs/design.md
# §4): Tekton Pipelines and Shipwright Build from their Go modules (platform.sh), a registry on
# the node's network, and e2e/shipwright/strategy.yaml, which builds an image for real. Checked:
# 1. a `build` WorkOrder applied with kubectl: the executor applies its Build and creates a
#    BuildRun by server-side apply; Tekton's TaskRun and its pod run on the real node; the image
#    is pushed; the order is Succeeded with the digest the registry gives for the pushed tag; the
#    image holds the file the Build asked for; the order's output has the lines of every step,
#    Tekton's init container included.
# 2. a strategy step that exits 1 (a base image that is not in the registry): Failed, and the
#    message carries Shipwright's reason and the step's exit code. A Build of a strategy that
#    does not exist: Failed with BuildRegistrationFailed and the reason Shipwright registered it
#    with.
# 3. a Dockerfile (FROM the registry's busybox, one RUN) built by kaniko (strategy.yaml's
#    pullman-kaniko) from source pushed as an OCI artifact, which Shipwright's bundle step pulls:
#    Succeeded with the pushed digest, the RUN's file in the image.
# 4. the figure: apply → Succeeded of a trivial build against a plain Job on the same node, in
#    the same run (BUILDS samples each, default 5), p50 and the slowest.
#
# pullman serve (with its controller, for this suite's namespace) and the executor run on this
# machine, as in e2e/keda, the executor with the test's admin credentials: the Role a `build`
# executor needs is the `rules` charts/pullman/values.yaml shows for one, not checked here. Needs KUBECONFIG and PULLMAN_TESTENV_STATE of a test control plane with its real node
# (PULLMAN_TESTENV_REAL_NODE=1), Go, and the pullman binary (PULLMAN_BIN, default
# target/debug/pullman). Figures are appended to PULLMAN_FIGURES if set. Leaves nothing behind:
# the controllers and the registry are stopped, the CRDs and namespaces deleted.
set -euo pipefail
cd "$(dirname "$0")/../.."
SUITE=shipwright
# shellcheck source=../lib/check.sh
. e2e/lib/check.sh
# shellcheck source=platform.sh
. e2e/shipwright/platform.sh
: "${KUBECONFIG:?KUBECONFIG must point at the test control plane (e2e/testenv/up.sh)}"
# shellcheck source=../lib/realnode.sh
. e2e/lib/realnode.sh
SAMPLES="${BUILDS:-5}"
real_node

WORK="$(mktemp -d /tmp/pullman-shipwright.XXXXXX)"
chmod 0755 "$WORK" # serve's embedded PostgreSQL runs as `postgres` and needs its data directory
NS="builds-$(openssl rand -hex 3)"
PIDS=()
diagnose() {
  echo "--- WorkOrders, BuildRuns, TaskRuns, pods"; k get workorders,buildruns,taskruns,pods -n "$NS" -o wide || true
  local f
  for f in executor serve tekton shipwright registry; do
    echo "--- $f log (last 15 lines)"; tail -n 15 "$WORK/$f.log" 2>/dev/null | cut -c1-400 || true
  done
}
cleanup() {
  set +e
  local pid
  # While serve runs: its controller takes its finalizer off the WorkOrders, which the namespace
  # waits for; if serve is gone, the finalizers are taken off here.
  if ! kubectl delete namespace "$NS" --timeout=60s >/dev/null 2>&1; then
    for w in $(kubectl get workorders -n "$NS" -o name 2>/dev/null); do
      kubectl patch -n "$NS" "$w" --type merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1
    done
  fi
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  platform_down
  rm -rf "$WORK"
}
trap cleanup EXIT

platform_up "$WORK"

step "pullman serve with its controller for $NS, and an executor on this machine"
k apply --server-side -f crds/pullman.dev.yaml >/dev/null || fail "applying Pullman's CRDs"
k create namespace "$NS" >/dev/null || fail "creating namespace $NS"
PORT="$(free_port)"
API="http://127.0.0.1:$PORT"
PULLMAN_ADMIN_TOKEN="$(openssl rand -hex 24)"
export PULLMAN_ADMIN_TOKEN PULLMAN_SERVER="$API"
"$PULLMAN" serve --controller on --watch-namespace "$NS" --leader-election-namespace "$NS" \
  --data-dir "$WORK/data" --listen "127.0.0.1:$PORT" > "$WORK/serve.log" 2>&1 &
serve_pid=$!
PIDS+=("$serve_pid")
serve_ready() { kill -0 "$serve_pid" 2>/dev/null || fail "pullman serve exited"; curl -fs -o /dev/null "$API/readyz"; }
until_true 120 "pullman serve ready" serve_ready
agent="$(admin -X POST "$API/api/v1/agents" -d '{"name": "builds", "labels": ["builds"]}')" \
  || fail "registering the agent: $agent"
jsonf 'd["token"]' <<<"$agent" > "$WORK/token"
"$PULLMAN" executor --server "$API" --token-file "$WORK/token" --target-namespace "$NS" \
  > "$WORK/executor.log" 2>&1 &
PIDS+=("$!")

# build_order NAME STRATEGY PARAMS_JSON [SOURCE_JSON]: a `build` WorkOrder whose Build runs the
# ClusterBuildStrategy STRATEGY with PARAMS_JSON (an object: name → value) on SOURCE_JSON (a
# Build `source`, none if not given) and pushes $REGISTRY/pullman/NAME:latest; its pod on the
# real node.
build_order() {
  python3 - "$1" "$2" "$3" "${4:-null}" "$REGISTRY" <<'PY'
import json, sys
name, strategy, params, source, registry = sys.argv[1:]
spec = {"strategy": {"kind": "ClusterBuildStrategy", "name": strategy},
        "paramValues": [{"name": k, "value": v} for k, v in json.loads(params).items()],
        "output": {"image": f"{registry}/pullman/{name}:latest", "insecure": True},
        "nodeSelector": {"pullman.dev/node": "real"},
        "tolerations": [{"key": "pullman.dev/node", "operator": "Equal", "value": "real",
                         "effect": "NoSchedule"}]}
if json.loads(source) is not None:
    spec["source"] = json.loads(source)
build = {"apiVersion": "shipwright.io/v1beta1", "kind": "Build", "metadata": {"name": name}, "spec": spec}
print(json.dumps({"apiVersion": "pullman.dev/v1alpha1", "kind": "WorkOrder", "metadata": {"name": name},
                  "spec": {"workType": "build", "claimTimeoutSeconds": 600, "maxRetries": 0,
                           "targeting": {"labels": ["builds"]}, "yamlContent": json.dumps(build)}}))
PY
}
# layer_order NAME BASE CONTENT [STRATEGY]: build_order of strategy.yaml's pullman-file-layer (or
# STRATEGY), which puts CONTENT on BASE.
layer_order() {
  build_order "$1" "${4:-pullman-file-layer}" \
    "$(python3 -c 'import json, sys; print(json.dumps({"base": sys.argv[1], "content": sys.argv[2]}))' "$2" "$3")"
}
# job_order NAME: a `custom` WorkOrder whose Job echoes once on the real node (the baseline).
job_order() {
  python3 - "$1" <<'PY'
import json, sys
name = sys.argv[1]
job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
       "spec": {"backoffLimit": 0, "template": {"spec": {
           "restartPolicy": "Never", "nodeSelector": {"pullman.dev/node": "real"},
           "tolerations": [{"key": "pullman.dev/node", "operator": "Equal", "value": "real", "effect": "NoSchedule"}],
           "containers": [{"name": "main", "image": "localhost/busybox:dev", "command": ["sh", "-c", "echo done"]}]}}}}
print(json.dumps({"apiVersion": "pullman.dev/v1alpha1", "kind": "WorkOrder", "metadata": {"name": name},
                  "spec": {"workType": "custom", "claimTimeoutSeconds": 600, "maxRetries": 0,
                           "targeting": {"labels": ["builds"]}, "yamlContent": json.dumps(job)}}))
PY
}
elapsed() { # elapsed NAME: seconds from the WorkOrder's creation to its completion
  python3 - "$(wo "$1" '{.metadata.creationTimestamp}')" "$(wo "$1" '{.status.completedAt}')" <<'PY'
import sys
from datetime import datetime
a, b = (datetime.fromisoformat(x.replace("Z", "+00:00")) for x in sys.argv[1:])
print(f"{(b - a).total_seconds():.1f}")
PY
}
phase() { k get -n "$NS" workorder "$1" -o jsonpath='{.status.phase}' 2>/dev/null; }
finished() { [[ "$(phase "$1")" == Succeeded || "$(phase "$1")" == Failed ]]; }
wo() { k get -n "$NS" workorder "$1" -o jsonpath="$2"; }
# run_order NAME [SECS]: applies the WorkOrder NAME on stdin and waits until it has finished
# (default 300 s).
run_order() {
  k apply -n "$NS" --server-side -f - >/dev/null || fail "applying WorkOrder $1"
  until_true "${2:-300}" "WorkOrder $1 finished" finished "$1"
}
# succeeded NAME: WorkOrder NAME is Succeeded, else fail with its phase and message.
succeeded() {
  [[ "$(phase "$1")" == Succeeded ]] || fail "WorkOrder $1 is $(phase "$1"): $(wo "$1" '{.status.message}')"
}
# pushed NAME: sets digest to what the registry gives for $REGISTRY/pullman/NAME:latest, which
# must be WorkOrder NAME's result, and exports the image's file system to $WORK/NAME.tar. (Not
# for $(…): fail must end the suite, not a subshell.)
pushed() {
  local reported
  digest="$("$SHP_BIN/crane" digest --insecure "$REGISTRY/pullman/$1:latest")" \
    || fail "no image pushed to $REGISTRY/pullman/$1:latest"
  reported="$(wo "$1" '{.status.message}')"
  [[ "$reported" == "$digest" ]] || fail "WorkOrder $1 reported '$reported', the registry has $digest"
  "$SHP_BIN/crane" export --insecure "$REGISTRY/pullman/$1:latest" "$WORK/$1.tar" \
    || fail "exporting the file system of $REGISTRY/pullman/$1:latest"
}
# output_has NAME LINE...: WorkOrder NAME's output (kept in $WORK/NAME.out) has each LINE.
output_has() {
  local name="$1" id line
  shift
  id="$(wo "$name" '{.status.workOrderId}')"
  "$PULLMAN" work-orders logs "$id" > "$WORK/$name.out" || fail "pullman work-orders logs $id"
  for line in "$@"; do
    grep -qF "$line" "$WORK/$name.out" || { cat "$WORK/$name.out" >&2; fail "the order's output lacks '$line'"; }
  done
}

step "1. a build WorkOrder applied with kubectl: a real BuildRun on $node, its image pushed"
content="built by Pullman $(openssl rand -hex 4)"
layer_order hello "$REGISTRY/base/busybox:dev" "$content" | run_order hello
succeeded hello
ok "WorkOrder hello Succeeded"
pushed hello
ok "the order's result is the pushed image's digest ($digest)"
run="$(k get buildruns -n "$NS" -o jsonpath='{.items[?(@.spec.build.name=="hello")].metadata.name}')"
[[ -n "$run" ]] || fail "no BuildRun of Build hello"
managers="$(k get buildrun -n "$NS" "$run" --show-managed-fields -o jsonpath='{.metadata.managedFields[*].operation}')"
[[ "$managers" == *Apply* ]] || fail "BuildRun $run was not created by server-side apply (operations: $managers)"
taskrun="$(k get buildrun -n "$NS" "$run" -o jsonpath='{.status.executor.name}')"
pod_node="$(k get pods -n "$NS" -l "buildrun.shipwright.io/name=$run" -o jsonpath='{.items[*].spec.nodeName}')"
[[ -n "$taskrun" && "$pod_node" == "$node" ]] || fail "BuildRun $run: TaskRun '$taskrun', pod on '$pod_node'"
ok "BuildRun $run (server-side apply) ran TaskRun $taskrun, its pod on $node"
got="$(tar -xOf "$WORK/hello.tar" pullman/message.txt)" || fail "no /pullman/message.txt in the pushed image"
[[ "$got" == "$content" ]] || fail "the pushed image's /pullman/message.txt holds '$got', not '$content'"
tar -tf "$WORK/hello.tar" > "$WORK/hello.files"
grep -qx 'bin/busybox' "$WORK/hello.files" || fail "the pushed image has no bin/busybox: not built on its base"
ok "the pushed image holds the Build's file on its base image"
output_has hello "Entrypoint initialization" "assembling /pullman/message.txt on $REGISTRY/base/busybox:dev" \
  "assembled " "Pushing the image to registry" "pushed"
ok "the order's output has every step's lines: prepare (init), step-assemble, step-image-processing ($(wc -l < "$WORK/hello.out") lines)"

step "2. a strategy step that exits 1: the order Failed with Shipwright's reason and the exit code"
layer_order broken "$REGISTRY/base/missing:dev" "never built" | run_order broken
message="$(wo broken '{.status.message}')"
[[ "$(phase broken)" == Failed ]] || fail "WorkOrder broken is $(phase broken): $message"
[[ "$message" == *": Failed: "* && "$message" == *"container step-assemble exited with code 1"* ]] \
  || fail "WorkOrder broken's message lacks the reason, the step or its exit code: $message"
ok "WorkOrder broken Failed: $message"
layer_order refused "$REGISTRY/base/busybox:dev" "never built" no-such-strategy | run_order refused 120
message="$(wo refused '{.status.message}')"
[[ "$(phase refused)" == Failed && "$message" == *": BuildRegistrationFailed: "*ClusterBuildStrategyNotFound* ]] \
  || fail "WorkOrder refused (a Build of a strategy that does not exist) is $(phase refused): $message"
ok "a Build of a strategy that does not exist: Failed with Shipwright's reasons ($message)"

step "3. a Dockerfile built by kaniko from source in an OCI artifact, its RUN step run in the pod"
mkdir -p "$WORK/src"
kcontent="run by kaniko $(openssl rand -hex 4)"
printf '%s\n' "FROM $REGISTRY/base/busybox:dev" \
  "RUN mkdir -p /pullman && echo '$kcontent' > /pullman/run.txt && echo \"RUN as \$(id -u) on \$(uname -m)\"" \
  > "$WORK/src/Dockerfile"
tar -C "$WORK/src" -cf "$WORK/src.tar" Dockerfile
"$SHP_BIN/crane" append --insecure -f "$WORK/src.tar" -t "$REGISTRY/pullman/source:1" >/dev/null 2>&1 \
  || fail "pushing the source artifact to $REGISTRY/pullman/source:1"
build_order dockerfile pullman-kaniko "{\"registry\": \"$REGISTRY\"}" \
  "{\"type\": \"OCI\", \"ociArtifact\": {\"image\": \"$REGISTRY/pullman/source:1\"}}" \
  | run_order dockerfile
succeeded dockerfile
pushed dockerfile
got="$(tar -xOf "$WORK/dockerfile.tar" pullman/run.txt)" || fail "no /pullman/run.txt in the Dockerfile image"
[[ "$got" == "$kcontent" ]] || fail "the Dockerfile image's /pullman/run.txt holds '$got', not '$kcontent'"
output_has dockerfile "Pulling image \"$REGISTRY/pullman/source:1\"" \
  "Image content was extracted to /workspace/source" "Retrieving image $REGISTRY/base/busybox:dev" \
  "RUN as 0 on" "Pushing the image to registry"
ok "WorkOrder dockerfile Succeeded in $(elapsed dockerfile) s with the pushed digest ($digest); its RUN step wrote /pullman/run.txt; output has the source's pull, kaniko's base pull, the RUN's own line and the push"

step "4. apply → Succeeded: $SAMPLES trivial builds against $SAMPLES plain Jobs, one at a time"
declare -a build_s job_s
for (( i = 1; i <= SAMPLES; i++ )); do
  job_order "plain-$i" | run_order "plain-$i"
  succeeded "plain-$i"
  job_s+=("$(elapsed "plain-$i")")
  layer_order "trivial-$i" "$REGISTRY/base/busybox:dev" "$i" | run_order "trivial-$i"
  succeeded "trivial-$i"
  build_s+=("$(elapsed "trivial-$i")")
done
p50() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
slowest() { printf '%s\n' "$@" | sort -n | tail -n 1; }
b="p50 $(p50 "${build_s[@]}") s, slowest $(slowest "${build_s[@]}") s"
j="p50 $(p50 "${job_s[@]}") s, slowest $(slowest "${job_s[@]}") s"
ok "builds: $b (${build_s[*]}); plain Jobs: $j (${job_s[*]})"
p50="$(p50 "${build_s[@]}")"
awk -v p="$p50" 'BEGIN { exit !(p <= 60) }' || fail "a trivial build's p50 apply → Succeeded is $p50 s (goal ≤ 60 s)"
ok "a trivial build's p50 apply → Succeeded ($p50 s) is within the 60 s goal"
if [[ -n "${PULLMAN_FIGURES:-}" ]]; then
  echo "| Shipwright build apply → Succeeded ($SAMPLES, real node) | $b; plain Job $j |" >> "$PULLMAN_FIGURES"
fi
finish
