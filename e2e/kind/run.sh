#!/usr/bin/env bash
# End-to-end on kind (machines with Docker, and the GitHub Actions workflow): builds the image,
# creates a cluster, installs CloudNativePG and a PostgreSQL cluster (the README's "On Kubernetes"
# recipe), then runs the scenario of e2e/scenario/run.sh: the chart with an Executor in its values,
# helm test, real Jobs succeeding and failing, leader takeover, the executor's pod deleted
# mid-order, a rollout restart under load, and a worker on this machine. CI runs the same scenario
# on the test control plane's real node (e2e/realnode/test.sh).
#
# Environment: CLUSTER (kind cluster name, default pullman), IMAGE (default
# ghcr.io/pullman-dev/pullman:e2e), SKIP_BUILD=1 to use an image already built, CNPG_CHART_VERSION
# to pin the CloudNativePG chart.
set -euo pipefail
cd "$(dirname "$0")/../.."
CLUSTER=${CLUSTER:-pullman}
IMAGE=${IMAGE:-ghcr.io/pullman-dev/pullman:e2e}
CNPG_VERSION_ARGS=(); [[ -n "${CNPG_CHART_VERSION:-}" ]] && CNPG_VERSION_ARGS=(--version "$CNPG_CHART_VERSION")

kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --wait 120s
# This cluster's kubeconfig, whatever the current context is (a second run, or Tilt's own cluster).
KUBECONFIG="$(mktemp)"; export KUBECONFIG
kind get kubeconfig --name "$CLUSTER" > "$KUBECONFIG"
# The scenario creates its WorkOrders by name and checks each from its start.
kubectl get namespace demo >/dev/null 2>&1 \
  && { echo "kind cluster $CLUSTER has run the scenario before: kind delete cluster --name $CLUSTER" >&2; exit 1; }
if [[ "${SKIP_BUILD:-0}" != 1 ]]; then docker build -t "$IMAGE" .; fi
kind load docker-image "$IMAGE" --name "$CLUSTER"

# PostgreSQL: CloudNativePG, whose `<cluster>-app` Secret (key `uri`) the chart reads as is.
helm repo add cnpg https://cloudnative-pg.github.io/charts --force-update >/dev/null
helm upgrade --install cnpg cnpg/cloudnative-pg "${CNPG_VERSION_ARGS[@]}" \
  --namespace cnpg-system --create-namespace --wait --timeout 5m
kubectl create namespace pullman-system --dry-run=client -o yaml | kubectl apply -f -
kubectl label --overwrite namespace pullman-system pod-security.kubernetes.io/enforce=restricted
kubectl apply -n pullman-system -f - <<'YAML'
apiVersion: postgresql.cnpg.io/v1
kind: Cluster
metadata: {name: pullman-db}
spec:
  instances: 1
  storage: {size: 1Gi}
  bootstrap: {initdb: {database: pullman, owner: pullman}}
YAML
kubectl -n pullman-system wait cluster/pullman-db --for=condition=Ready --timeout=600s

# Pullman and everything after it: the scenario the test control plane's real node runs in CI
# (e2e/realnode/test.sh), here with kind's nodes, the image just loaded and Docker Hub's busybox.
cat > /tmp/pullman-e2e-values.yaml <<YAML
image: {repository: ${IMAGE%:*}, tag: ${IMAGE##*:}, pullPolicy: Never}
database: {existingSecret: pullman-db-app}
YAML
cargo build --locked --bin pullman   # the scenario's worker and CLI run on this machine
SCENARIO_VALUES=/tmp/pullman-e2e-values.yaml SCENARIO_SERVE_URL=port-forward \
  SCENARIO_FIGURES="${SCENARIO_FIGURES:-}" e2e/scenario/run.sh
