#!/usr/bin/env bash
# End-to-end on kind (machines with Docker, and the GitHub Actions workflow): the README's "On
# Kubernetes" recipe, top to bottom. Builds the image, creates a cluster, installs CloudNativePG and
# a PostgreSQL cluster, installs Pullman with the chart (CRDs, server, an Executor with its
# ServiceAccount and Role), runs `helm test`, applies the pi WorkOrder and waits until it is
# Succeeded. The same flow runs without Docker in e2e/chart/test.sh against e2e/testenv.
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

# Pullman, with an Executor for the namespace `demo` allowed to run Jobs there.
kubectl create namespace demo --dry-run=client -o yaml | kubectl apply -f -
cat > /tmp/pullman-e2e-values.yaml <<YAML
image: {repository: ${IMAGE%:*}, tag: ${IMAGE##*:}, pullPolicy: Never}
database: {existingSecret: pullman-db-app}
executors:
  - name: demo
    namespace: demo
    labels: [demo]
    workTypes: [custom]
    rules:
      - {apiGroups: [batch], resources: [jobs], verbs: [get, list, watch, create, patch, delete, deletecollection]}
YAML
# One first install, as the README's recipe: Helm creates the CRDs from the chart's crds/, then the
# Executor with the rest. Not `upgrade --install`: on a cluster kept from an earlier run that would
# test an upgrade instead (Helm refuses the name; `kind delete cluster --name $CLUSTER` first).
helm install pullman charts/pullman -n pullman-system -f /tmp/pullman-e2e-values.yaml --wait --timeout 5m
kubectl -n demo get executor/demo >/dev/null   # created by the first install, not a later upgrade
helm test pullman -n pullman-system --timeout 3m
kubectl -n demo wait executor/demo --for=condition=Ready --timeout=300s

kubectl -n demo apply -f config/samples/workorder-pi-job.yaml
kubectl -n demo wait workorder/pi --for=jsonpath='{.status.phase}'=Succeeded --timeout=600s
kubectl -n demo get workorder pi -o jsonpath='{.status.message}{"\n"}'
