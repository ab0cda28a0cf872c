# shellcheck shell=bash
# CloudNativePG on the test control plane's real node (issue #41): a PostgreSQL cluster of three
# instances with synchronous replication, for e2e/cnpg/test.sh. Source it (after
# e2e/lib/check.sh), then:
#   cnpg_up WORK    builds or finds the manager (build.sh), imports the PostgreSQL image
#       (e2e/testenv/images.sh cnpg-postgresql), applies CloudNativePG's CRDs from its Go module,
#       starts the operator on this machine (log in WORK), makes five hostPath volumes under WORK,
#       and creates the namespace and the Cluster of charts/pullman/README.md's CloudNativePG
#       section (readme.py), with what this environment adds (below); waits until its three
#       instances are ready. Sets CNPG_NS, CNPG_CLUSTER and CNPG_IMAGE.
#   cnpg_primary    the current primary's pod name (the Cluster's status.currentPrimary)
#   cnpg_down       stops the operator, deletes the Cluster, its volumes, the namespace and the CRDs.
#
# The operator runs as a process here with the test's admin kubeconfig, as KEDA's and Tekton's
# do, so CloudNativePG's RBAC is not applied. Its webhooks do not run: with WEBHOOK_CERT_DIR set
# it takes a self-signed pair from there and never looks for its webhook configurations, and its
# reconciler applies the Cluster's defaults itself when no webhook did. It copies its own binary
# into each pod from the image OPERATOR_IMAGE_NAME names: that is the PostgreSQL image here, which
# holds the same manager at /manager. It finds its architecture by the file
# operator/manager_<arch> beside its working directory, as in its own image.
#
# The Cluster is the README's (3 instances, `synchronous: {method: any, number: 1,
# dataDurability: required}`: a commit waits for one standby; `smartShutdownTimeout: 5`), with
# what only this environment needs: its image, `imagePullPolicy: Never` (no registry), the real
# node (its label and taint, e2e/testenv/node.sh), storage on hostPath volumes of a
# no-provisioner StorageClass (the node has no provisioner), and a small shared_buffers.
CNPG_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CNPG_NS="$("$CNPG_DIR/readme.py" namespace)"
CNPG_CLUSTER=""
CNPG_IMAGE=""
CNPG_PID=""
CNPG_CRDS=""
CNPG_WORK=""

cnpg_up() {
  local work="$1" bin module i
  CNPG_WORK="$work"
  step "CloudNativePG from its Go module (e2e/cnpg/build.sh; cached)"
  bin="$("$CNPG_DIR/build.sh" | tail -n 1)" || fail "building CloudNativePG"
  module="$(cat "$bin/cnpg")"
  CNPG_IMAGE="$("$CNPG_DIR/../testenv/images.sh" cnpg-postgresql "$bin" | tail -n 1)" \
    || fail "building and importing the PostgreSQL image"
  ok "$(basename "$module" | sed 's/.*@/CloudNativePG /'), image $CNPG_IMAGE imported"

  CNPG_CRDS="$work/crds.yaml"
  cat "$module"/config/crd/bases/*.yaml > "$CNPG_CRDS"
  k apply --server-side --force-conflicts -f "$CNPG_CRDS" >/dev/null || fail "applying CloudNativePG's CRDs"
  k wait --for condition=Established --timeout=60s -f "$CNPG_CRDS" >/dev/null || fail "CRDs not established"

  mkdir -p "$work/operator" "$work/certs"
  cp "$bin/manager" "$work/operator/manager_amd64"
  openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=cnpg-webhook-service" \
    -keyout "$work/certs/apiserver.key" -out "$work/certs/apiserver.crt" >/dev/null 2>&1 \
    || fail "making the webhook server's self-signed pair (openssl)"
  (cd "$work" && exec env OPERATOR_IMAGE_NAME="$CNPG_IMAGE" POSTGRES_IMAGE_NAME="$CNPG_IMAGE" \
    WEBHOOK_CERT_DIR="$work/certs" "$work/operator/manager_amd64" controller \
    --metrics-bind-address=0 --webhook-port="$(free_port)" > "$work/operator.log" 2>&1) &
  CNPG_PID=$!
  sleep 3
  kill -0 "$CNPG_PID" 2>/dev/null || fail "CloudNativePG's operator exited: $(tail -n 3 "$work/operator.log")"
  ok "operator started (log: $work/operator.log)"

  # A run just before may have left it terminating (its pods stop within their grace period).
  if k get namespace "$CNPG_NS" >/dev/null 2>&1; then
    k wait --for=delete "namespace/$CNPG_NS" --timeout=180s >/dev/null 2>&1 \
      || fail "namespace $CNPG_NS exists (from another run?) and was not deleted within 180 s"
  fi
  k create namespace "$CNPG_NS" >/dev/null || fail "creating namespace $CNPG_NS"
  local label
  for label in $("$CNPG_DIR/readme.py" labels); do
    k label namespace "$CNPG_NS" "$label" >/dev/null || fail "labelling namespace $CNPG_NS $label"
  done
  {
    printf '%s\n' "apiVersion: storage.k8s.io/v1" "kind: StorageClass" \
      "metadata: {name: $CNPG_NS}" "provisioner: kubernetes.io/no-provisioner" \
      "volumeBindingMode: WaitForFirstConsumer" "reclaimPolicy: Retain"
    for i in 1 2 3 4 5; do
      mkdir -p "$work/volumes/$i"
      chown 26:26 "$work/volumes/$i"
      chmod 0700 "$work/volumes/$i"
      printf '%s\n' "---" "apiVersion: v1" "kind: PersistentVolume" "metadata: {name: $CNPG_NS-$i}" \
        "spec:" "  storageClassName: $CNPG_NS" "  capacity: {storage: 1Gi}" \
        "  accessModes: [ReadWriteOnce]" "  hostPath: {path: $work/volumes/$i, type: Directory}"
    done
  } > "$work/volumes.yaml"
  k apply -f "$work/volumes.yaml" >/dev/null || fail "applying the StorageClass and volumes"
  "$CNPG_DIR/readme.py" cluster "$(cat <<JSON
{"spec": {"imageName": "$CNPG_IMAGE", "imagePullPolicy": "Never",
  "storage": {"storageClass": "$CNPG_NS"},
  "affinity": {"nodeSelector": {"pullman.dev/node": "real"},
    "tolerations": [{"key": "pullman.dev/node", "operator": "Equal", "value": "real", "effect": "NoSchedule"}]},
  "postgresql": {"parameters": {"shared_buffers": "64MB", "max_connections": "200"}}}}
JSON
)" > "$work/cluster.yaml" || fail "reading the Cluster of charts/pullman/README.md"
  CNPG_CLUSTER="$(python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["metadata"]["name"])' "$work/cluster.yaml")"
  k apply -n "$CNPG_NS" -f "$work/cluster.yaml" >/dev/null || fail "applying the Cluster"
  step "Cluster $CNPG_NS/$CNPG_CLUSTER (charts/pullman/README.md): 3 instances, synchronous replication"
  until_true 300 "the Cluster's 3 instances ready" cnpg_ready 3
  ok "3 instances ready, primary $(cnpg_primary)"
}

# cnpg_ready N: the Cluster has N ready instances and says it is healthy.
cnpg_ready() {
  local status
  status="$(k get cluster -n "$CNPG_NS" "$CNPG_CLUSTER" -o json 2>/dev/null)" || return 1
  jsonf "d['status'].get('readyInstances', 0) == $1 and d['status'].get('phase') == 'Cluster in healthy state'" <<<"$status" | grep -qx True
}

cnpg_primary() {
  k get cluster -n "$CNPG_NS" "$CNPG_CLUSTER" -o jsonpath='{.status.currentPrimary}'
}

cnpg_down() {
  if [[ -n "$CNPG_PID" && -n "$CNPG_CLUSTER" ]]; then
    kubectl delete cluster -n "$CNPG_NS" "$CNPG_CLUSTER" --ignore-not-found --timeout=60s >/dev/null 2>&1 || true
  fi
  if [[ -n "$CNPG_PID" ]]; then
    kill -TERM "$CNPG_PID" 2>/dev/null || true
    wait "$CNPG_PID" 2>/dev/null || true
    CNPG_PID=""
  fi
  kubectl delete namespace "$CNPG_NS" --ignore-not-found --timeout=60s >/dev/null 2>&1 || true
  if [[ -n "$CNPG_WORK" && -f "$CNPG_WORK/volumes.yaml" ]]; then
    kubectl delete --ignore-not-found -f "$CNPG_WORK/volumes.yaml" --timeout=30s >/dev/null 2>&1 || true
  fi
  if [[ -n "$CNPG_CRDS" ]]; then
    kubectl delete --ignore-not-found --wait=false -f "$CNPG_CRDS" >/dev/null 2>&1 || true
  fi
}
