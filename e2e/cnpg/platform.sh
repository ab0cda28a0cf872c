# shellcheck shell=bash
# CloudNativePG on the test control plane's real node (issue #41): a PostgreSQL cluster of three
# instances with synchronous replication, for e2e/cnpg/test.sh. Source it (after
# e2e/lib/check.sh), then:
#   cnpg_up WORK    builds or finds the manager (build.sh), imports the PostgreSQL image
#       (e2e/testenv/images.sh cnpg-postgresql), applies CloudNativePG's CRDs from its Go module,
#       starts the operator on this machine (log in WORK), makes five hostPath volumes under WORK
#       and applies the Cluster (below); waits until its three instances are ready. Sets
#       CNPG_NS, CNPG_CLUSTER and CNPG_IMAGE.
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
# The Cluster: 3 instances, `synchronous: {method: any, number: 1, dataDurability: required}`
# (a commit waits for one standby), on the real node (its label and taint, e2e/testenv/node.sh),
# storage on hostPath volumes of a no-provisioner
# StorageClass (the node has no provisioner). `smartShutdownTimeout: 5`: a deleted primary stops
# taking part after 5 s, not after CloudNativePG's default 180 s, during which a pooled client
# such as Pullman keeps working on it through the sessions it already has.
CNPG_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CNPG_NS=pullman-cnpg
CNPG_CLUSTER=pullman-db
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

  k create namespace "$CNPG_NS" >/dev/null || fail "creating namespace $CNPG_NS"
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
  cat > "$work/cluster.yaml" <<YAML
apiVersion: postgresql.cnpg.io/v1
kind: Cluster
metadata: {name: $CNPG_CLUSTER, namespace: $CNPG_NS}
spec:
  instances: 3
  imageName: $CNPG_IMAGE
  imagePullPolicy: Never
  smartShutdownTimeout: 5
  stopDelay: 60
  switchoverDelay: 60
  storage: {storageClass: $CNPG_NS, size: 1Gi}
  affinity:
    nodeSelector: {pullman.dev/node: real}
    tolerations: [{key: pullman.dev/node, operator: Equal, value: real, effect: NoSchedule}]
  bootstrap:
    initdb: {database: pullman, owner: pullman}
  postgresql:
    parameters: {shared_buffers: 64MB, max_connections: "200"}
    synchronous: {method: any, number: 1, dataDurability: required}
YAML
  k apply -f "$work/cluster.yaml" >/dev/null || fail "applying the Cluster"
  step "Cluster $CNPG_NS/$CNPG_CLUSTER: 3 instances, synchronous replication"
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
  if [[ -n "$CNPG_PID" ]]; then
    kubectl delete cluster -n "$CNPG_NS" "$CNPG_CLUSTER" --ignore-not-found --timeout=60s >/dev/null 2>&1 || true
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
