# shellcheck shell=bash
# Tekton Pipelines and Shipwright Build for real on the test control plane's real node, and a
# registry build pods push to (issue #38). Source it (after e2e/lib/check.sh), then:
#   platform_up WORK   builds or finds the binaries (build.sh), imports localhost/shipwright-tools:dev,
#       starts the registry on the node's bridge address (in memory: nothing is left on disk),
#       pushes localhost/busybox:dev to it as base/busybox:dev, applies both projects' CRDs and
#       Tekton's configuration from their Go modules, starts both controllers on this machine
#       (logs in WORK) and applies e2e/shipwright/strategy.yaml. Sets REGISTRY (host:port) and
#       SHP_BIN.
#   platform_down      stops the controllers and the registry, and deletes what platform_up applied
#       (CRDs, with every object of theirs, and the controllers' namespaces).
#
# The controllers run as processes here, with the test's admin kubeconfig, as KEDA's do
# (e2e/keda): so the modules' RBAC is not applied. Their webhooks do not run: the CRDs are applied
# with `conversion: {strategy: None}`, every client here reads and writes the storage version
# (Tekton v1 TaskRuns, Shipwright v1beta1), and the other served versions are only discovered
# (Shipwright checks that TaskRun v1beta1 exists before it starts). Without the admission webhooks
# nothing defaults or validates objects on create; Tekton's and Shipwright's reconcilers default
# what they read, which is what a BuildRun here needs.
SHP_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NODE_GATEWAY=10.88.0.1 # the real node's bridge address (e2e/testenv/node.sh), which pods reach
PLATFORM_PIDS=()
PLATFORM_APPLIED=""
REGISTRY=""
SHP_BIN=""

# The CRDs of both modules, conversion webhooks left out (see above).
platform_crds() {
  python3 - "$@" <<'PY'
import sys, yaml
for path in sys.argv[1:]:
    for d in yaml.safe_load_all(open(path)):
        if d and d.get("kind") == "CustomResourceDefinition":
            d["spec"]["conversion"] = {"strategy": "None"}
            print("---")
            print(yaml.safe_dump(d), end="")
PY
}

platform_up() {
  local work="$1" tekton shipwright port f
  step "Tekton and Shipwright from their Go modules (e2e/shipwright/build.sh; cached)"
  SHP_BIN="$("$SHP_DIR/build.sh" | tail -n 1)" || fail "building Tekton and Shipwright"
  tekton="$(cat "$SHP_BIN/tekton")" shipwright="$(cat "$SHP_BIN/shipwright")"
  "$SHP_DIR/../testenv/images.sh" shipwright-tools "$SHP_BIN" || fail "importing localhost/shipwright-tools:dev"

  port="$(python3 -c "import socket; s=socket.socket(); s.bind(('$NODE_GATEWAY', 0)); print(s.getsockname()[1])")"
  REGISTRY="$NODE_GATEWAY:$port"
  "$SHP_BIN/crane" registry serve --address "$REGISTRY" > "$work/registry.log" 2>&1 &
  PLATFORM_PIDS+=("$!")
  local i
  for (( i = 0; i < 50; i++ )); do curl -fs -o /dev/null "http://$REGISTRY/v2/" && break; sleep 0.2; done
  curl -fs -o /dev/null "http://$REGISTRY/v2/" || fail "the registry on $REGISTRY did not answer"
  ctr --address "$PULLMAN_TESTENV_STATE/node/containerd.sock" --namespace k8s.io images export \
    "$work/busybox.tar" localhost/busybox:dev || fail "exporting localhost/busybox:dev from the node"
  "$SHP_BIN/crane" push --insecure "$work/busybox.tar" "$REGISTRY/base/busybox:dev" >/dev/null 2>&1 \
    || fail "pushing base/busybox:dev to $REGISTRY"
  ok "registry on $REGISTRY (crane registry serve), base/busybox:dev pushed"

  platform_crds "$tekton"/config/300-crds/*.yaml "$shipwright"/deploy/crds/*.yaml > "$work/crds.yaml"
  PLATFORM_APPLIED="$work/crds.yaml"
  # --force-conflicts: the Kubernetes tests' minimal Shipwright CRDs (e2e/crds) may be there.
  k apply --server-side --force-conflicts -f "$work/crds.yaml" >/dev/null || fail "applying the CRDs"
  k wait --for condition=Established --timeout=60s -f "$work/crds.yaml" >/dev/null \
    || fail "CRDs not established"
  k apply --server-side -f "$tekton/config/100-namespace/" -f "$shipwright/deploy/100-namespace.yaml" >/dev/null \
    || fail "applying the controllers' namespaces"
  for f in "$tekton"/config/config-*.yaml; do
    k apply --server-side --force-conflicts -f "$f" >/dev/null || fail "applying Tekton's $(basename "$f")"
  done

  # Knative's shared main, under Tekton's controller, serves probes on :8080 whatever it is told,
  # and Shipwright's controller its metrics on :8383.
  command -v ss >/dev/null || fail "ss is missing (apt install iproute2)"
  for port in 8080 8383; do
    [[ -z "$(ss -ltnH "sport = :$port")" ]] \
      || fail "port $port is taken here: Tekton's (8080, probes) or Shipwright's (8383, metrics) controller always listens there"
  done
  # Tekton's controller as its Deployment (config/controller.yaml) starts it, with every image
  # role played by localhost/shipwright-tools:dev and the shell by localhost/busybox:dev; its
  # probes, profiling and metrics servers on free ports.
  SYSTEM_NAMESPACE=tekton-pipelines KUBERNETES_MIN_VERSION=v1.28.0 \
    CONFIG_DEFAULTS_NAME=config-defaults CONFIG_LOGGING_NAME=config-logging \
    CONFIG_OBSERVABILITY_NAME=config-observability CONFIG_FEATURE_FLAGS_NAME=feature-flags \
    CONFIG_LEADERELECTION_NAME=config-leader-election-controller CONFIG_SPIRE=config-spire \
    METRICS_DOMAIN=tekton.dev/pipeline PROBES_PORT="$(free_port)" PROFILING_PORT="$(free_port)" \
    METRICS_PROMETHEUS_HOST=127.0.0.1 METRICS_PROMETHEUS_PORT="$(free_port)" \
    "$SHP_BIN/tekton-controller" -kubeconfig "$KUBECONFIG" -disable-ha \
    -entrypoint-image localhost/shipwright-tools:dev -nop-image localhost/shipwright-tools:dev \
    -sidecarlogresults-image localhost/shipwright-tools:dev \
    -workingdirinit-image localhost/shipwright-tools:dev \
    -shell-image localhost/busybox:dev -shell-image-win localhost/busybox:dev \
    > "$work/tekton.log" 2>&1 &
  PLATFORM_PIDS+=("$!")
  # Shipwright's controller as deploy/500-controller.yaml starts it, every namespace watched.
  WATCH_NAMESPACE="" BUILD_CONTROLLER_LEADER_ELECTION_NAMESPACE=shipwright-build \
    CONTROLLER_NAME=shipwright-build GIT_ENABLE_REWRITE_RULE=false \
    GIT_CONTAINER_IMAGE=localhost/shipwright-tools:dev \
    IMAGE_PROCESSING_CONTAINER_IMAGE=localhost/shipwright-tools:dev \
    BUNDLE_CONTAINER_IMAGE=localhost/shipwright-tools:dev \
    WAITER_CONTAINER_IMAGE=localhost/shipwright-tools:dev \
    "$SHP_BIN/shipwright-build-controller" --kubeconfig "$KUBECONFIG" \
    > "$work/shipwright.log" 2>&1 &
  PLATFORM_PIDS+=("$!")
  k apply --server-side -f "$SHP_DIR/strategy.yaml" >/dev/null || fail "applying the build strategy"
  # A controller that cannot start exits within seconds (a port taken, a CRD missing): say so here
  # rather than as a build that never ends.
  sleep 3
  kill -0 "${PLATFORM_PIDS[1]}" 2>/dev/null || fail "Tekton's controller exited: $(tail -n 3 "$work/tekton.log")"
  kill -0 "${PLATFORM_PIDS[2]}" 2>/dev/null || fail "Shipwright's controller exited: $(tail -n 3 "$work/shipwright.log")"
  ok "Tekton $(basename "$tekton" | sed 's/.*@//') and Shipwright $(basename "$shipwright" | sed 's/.*@//') controllers started (logs: $work/tekton.log, $work/shipwright.log)"
}

platform_down() {
  local pid
  for pid in "${PLATFORM_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PLATFORM_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PLATFORM_PIDS=()
  if [[ -n "$PLATFORM_APPLIED" ]]; then
    kubectl delete --ignore-not-found --wait=false -f "$PLATFORM_APPLIED" >/dev/null 2>&1 || true
    kubectl delete --ignore-not-found --wait=false namespace tekton-pipelines shipwright-build >/dev/null 2>&1 || true
  fi
}
