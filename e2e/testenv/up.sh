#!/usr/bin/env bash
# Start a real Kubernetes control plane as local processes on loopback:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok
# (simulating one fake node), and beside it a real node (node.sh: containerd,
# kubelet, kube-proxy, CoreDNS) whose pods run real containers. Writes
# <state>/kubeconfig and prints `export KUBECONFIG=...` as the last line on stdout.
#
# Environment:
#   PULLMAN_TESTENV_STATE     state dir (default /tmp/pullman-testenv)
#   PULLMAN_TESTENV_CACHE     binary cache root, see build.sh
#   PULLMAN_TESTENV_BIN       use binaries from this dir instead of build.sh
#   PULLMAN_TESTENV_NODE      fake node name (default kwok-node-0)
#   PULLMAN_TESTENV_TIMEOUT   seconds to wait for readiness (default 120)
#   PULLMAN_TESTENV_REAL_NODE 1 (default): start the real node too (root, Debian's containerd,
#                             runc, containernetworking-plugins, iptables, conntrack,
#                             busybox-static); 0: kwok nodes only
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="${PULLMAN_TESTENV_STATE:-/tmp/pullman-testenv}"
NODE="${PULLMAN_TESTENV_NODE:-kwok-node-0}"
TIMEOUT="${PULLMAN_TESTENV_TIMEOUT:-120}"
REAL_NODE="${PULLMAN_TESTENV_REAL_NODE:-1}"
# The real node's bridge address (node.sh): its node IP, and where pods reach the API server.
NODE_GATEWAY=10.88.0.1

log() { echo "up.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

alive() { # alive <name>: the recorded process is running
  local f="$STATE/pids/$1.pid" pid
  [[ -f "$f" ]] || return 1
  pid="$(cat "$f")"
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 1
  [[ "$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null)" != Z ]]  # not a zombie
}

COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
[[ "$REAL_NODE" == 1 ]] && COMPONENTS+=(containerd kubelet kube-proxy coredns)

# --- already up? ------------------------------------------------------------
if [[ -d "$STATE" && ! -f "$STATE/.pullman-testenv" && -n "$(ls -A "$STATE")" ]]; then
  die "$STATE exists, is not empty and is not a testenv state dir; refusing to use it"
fi
if [[ -f "$STATE/.pullman-testenv" ]]; then
  all=1
  for c in "${COMPONENTS[@]}"; do alive "$c" || all=0; done
  if [[ $all == 1 ]] && kubectl --kubeconfig "$STATE/kubeconfig" --request-timeout=5s get --raw /readyz >/dev/null 2>&1; then
    log "already up (state: $STATE)"
    echo "export KUBECONFIG=$STATE/kubeconfig"
    exit 0
  fi
  log "found stale/partial state in $STATE; tearing it down first"
  PULLMAN_TESTENV_STATE="$STATE" "$HERE/down.sh" >&2
fi

command -v kubectl >/dev/null || die "kubectl is not on PATH"
command -v openssl >/dev/null || die "openssl is not on PATH"

if [[ -n "${PULLMAN_TESTENV_BIN:-}" ]]; then
  BIN="$PULLMAN_TESTENV_BIN"
else
  BIN="$("$HERE/build.sh" | tail -n1)"
fi
for c in "${COMPONENTS[@]}"; do [[ "$c" == containerd || -x "$BIN/$c" ]] || die "missing $BIN/$c"; done
if [[ "$REAL_NODE" == 1 ]] && ! why="$("$HERE/node.sh" check)"; then
  die "the real node cannot start here: ${why//$'\n'/; } (PULLMAN_TESTENV_REAL_NODE=0 starts kwok nodes only)"
fi

t0=$(date +%s.%N)
mkdir -p "$STATE"/{pids,logs,certs}
touch "$STATE/.pullman-testenv"   # marker: down.sh only deletes dirs carrying it
echo "$BIN" > "$STATE/bin"

# On failure, show the log tails and stop what we started.
cleanup_on_error() {
  local rc=$?
  [[ $rc == 0 ]] && return
  log "start-up failed (rc=$rc); last log lines:"
  for f in "$STATE"/logs/*.log; do
    [[ -f "$f" ]] || continue
    echo "----- $f" >&2; tail -n 20 "$f" >&2
  done
  log "stopping; set PULLMAN_TESTENV_KEEP_ON_ERROR=1 to keep the state for debugging"
  if [[ "${PULLMAN_TESTENV_KEEP_ON_ERROR:-0}" != 1 ]]; then
    PULLMAN_TESTENV_STATE="$STATE" "$HERE/down.sh" >&2 || true
  fi
}
trap cleanup_on_error EXIT

# --- free loopback ports -----------------------------------------------------
USED_PORTS=" "
port_busy() {
  if command -v ss >/dev/null; then
    [[ -n "$(ss -Hltn "sport = :$1" 2>/dev/null)" ]]
  else
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
  fi
}
free_port() {
  local p i
  for i in $(seq 1 200); do
    p=$(( 20000 + (RANDOM * 32768 + RANDOM) % 30000 ))
    [[ "$USED_PORTS" == *" $p "* ]] && continue
    port_busy "$p" && continue
    USED_PORTS+="$p "
    echo "$p"; return 0
  done
  die "no free port found"
}
ETCD_PORT=$(free_port)
ETCD_PEER_PORT=$(free_port)
API_PORT=$(free_port)
cat > "$STATE/ports" <<EOF
ETCD_PORT=$ETCD_PORT
ETCD_PEER_PORT=$ETCD_PEER_PORT
API_PORT=$API_PORT
EOF

# --- certificates (ECDSA P-256: fast to generate) ---------------------------
C="$STATE/certs"
ossl() { openssl "$@" >/dev/null 2>&1 || { openssl "$@"; die "openssl $1 failed"; }; }
newkey() { ossl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }
newca() { # newca <name> <CN>: a self-signed CA, <name>.key and <name>.crt
  newkey "$C/$1.key"
  ossl req -x509 -new -key "$C/$1.key" -subj "/CN=$2" -days 3650 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$C/$1.crt"
}
sign() { # sign <name> <subject> <extfile-content> [<ca name>, default ca]
  local ca="${4:-ca}"
  newkey "$C/$1.key"
  ossl req -new -key "$C/$1.key" -subj "$2" -out "$C/$1.csr"
  printf '%s\n' "$3" > "$C/$1.ext"
  ossl x509 -req -in "$C/$1.csr" -CA "$C/$ca.crt" -CAkey "$C/$ca.key" -CAcreateserial \
    -days 3650 -extfile "$C/$1.ext" -out "$C/$1.crt"
}
newca ca pullman-testenv-ca
sign apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.0.0.1,IP:$NODE_GATEWAY,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
sign admin "/O=system:masters/CN=pullman-admin" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
# The aggregation layer: kube-apiserver proxies an APIService's group (e2e/keda runs KEDA's
# external-metrics adapter this way) with this client certificate, and the extension server trusts
# the X-Remote-* headers of requests signed by this CA (published in kube-system's ConfigMap
# extension-apiserver-authentication). A CA of its own, as Kubernetes asks: the client CA must not
# trust it.
newca front-proxy-ca pullman-testenv-front-proxy-ca
sign front-proxy-client "/CN=front-proxy-client" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth" front-proxy-ca
newkey "$C/sa.key"
ossl pkey -in "$C/sa.key" -pubout -out "$C/sa.pub"

b64() { base64 -w0 < "$1"; }
cat > "$STATE/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: pullman-testenv
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(b64 "$C/ca.crt")
users:
- name: pullman-admin
  user:
    client-certificate-data: $(b64 "$C/admin.crt")
    client-key-data: $(b64 "$C/admin.key")
contexts:
- name: pullman-testenv
  context:
    cluster: pullman-testenv
    user: pullman-admin
    namespace: default
current-context: pullman-testenv
EOF
chmod 600 "$STATE/kubeconfig"
KC="$STATE/kubeconfig"
k() { kubectl --kubeconfig "$KC" --request-timeout=10s "$@"; }

# --- process start ------------------------------------------------------------
start() { # start <name> <args...>: run $BIN/<name> detached, in its own session
  local name="$1"; shift
  setsid "$BIN/$name" "$@" >"$STATE/logs/$name.log" 2>&1 </dev/null &
  echo $! > "$STATE/pids/$name.pid"
}
DEADLINE=$(( $(date +%s) + TIMEOUT ))
wait_for() { # wait_for <what> <component> <command...>
  local what="$1" comp="$2"; shift 2
  until "$@" >/dev/null 2>&1; do
    alive "$comp" || die "$comp exited while waiting for $what (see $STATE/logs/$comp.log)"
    (( $(date +%s) < DEADLINE )) || die "timed out waiting for $what"
    sleep 0.2
  done
  log "$what ok ($(elapsed)s)"
}
elapsed() { awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.1f", a - b }'; }

start etcd \
  --name=pullman --data-dir="$STATE/etcd" \
  --listen-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster="pullman=http://127.0.0.1:$ETCD_PEER_PORT" \
  --unsafe-no-fsync=true --log-level=warn \
  --quota-backend-bytes=8589934592 \
  --auto-compaction-mode=periodic --auto-compaction-retention=1m
# A larger space quota and compaction every minute: the scale benchmarks (bench/k8s_scale.rs)
# write tens of thousands of objects and revisions, which fill etcd's default 2 GiB.
wait_for "etcd" etcd curl -fsS "http://127.0.0.1:$ETCD_PORT/health"

# With the real node, pods reach the API server (Service `kubernetes`) on the bridge address, the
# API server reaches kubelets by their InternalIP, and pods get their ServiceAccount token from the
# ServiceAccount admission plugin, as on any cluster. Without it, pods never run and get no token.
if [[ "$REAL_NODE" == 1 ]]; then
  api_net=(--advertise-address="$NODE_GATEWAY" --bind-address=0.0.0.0 --kubelet-preferred-address-types=InternalIP)
else
  api_net=(--advertise-address=127.0.0.1 --bind-address=127.0.0.1 --disable-admission-plugins=ServiceAccount)
fi
start kube-apiserver \
  --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  "${api_net[@]}" --secure-port="$API_PORT" \
  --cert-dir="$C" --tls-cert-file="$C/apiserver.crt" --tls-private-key-file="$C/apiserver.key" \
  --client-ca-file="$C/ca.crt" \
  --service-cluster-ip-range=10.0.0.0/24 \
  --allow-privileged=true \
  --authorization-mode=RBAC \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$C/sa.pub" \
  --service-account-signing-key-file="$C/sa.key" \
  --requestheader-client-ca-file="$C/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
  --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
  --requestheader-extra-headers-prefix=X-Remote-Extra- \
  --proxy-client-cert-file="$C/front-proxy-client.crt" --proxy-client-key-file="$C/front-proxy-client.key" \
  --v=1
wait_for "kube-apiserver /readyz" kube-apiserver k get --raw /readyz

# HPAs read their metrics every 3 s, not every 15: e2e/keda proves KEDA's 1 -> N with orders that
# last seconds (no other test makes an HPA).
start kube-controller-manager \
  --kubeconfig="$KC" --authentication-kubeconfig="$KC" --authorization-kubeconfig="$KC" \
  --bind-address=127.0.0.1 --secure-port=0 \
  --service-account-private-key-file="$C/sa.key" \
  --root-ca-file="$C/ca.crt" \
  --cluster-signing-cert-file="$C/ca.crt" --cluster-signing-key-file="$C/ca.key" \
  --leader-elect=false --controllers='*' \
  --horizontal-pod-autoscaler-sync-period=3s \
  --v=1

start kube-scheduler \
  --kubeconfig="$KC" --authentication-kubeconfig="$KC" --authorization-kubeconfig="$KC" \
  --bind-address=127.0.0.1 --secure-port=0 \
  --leader-elect=false \
  --v=1

# kwok's own stages come from the kwok module in the Go module cache (the build downloaded it;
# `go mod download` fetches it again if the cache was cleaned); kwok/ holds only the stages
# Pullman defines (a failing pod, the changed completion).
KWOK_MOD="$(cd "$HERE/tools/kwok" && GOFLAGS=-mod=readonly GOTOOLCHAIN="${GOTOOLCHAIN:-local}" \
  go mod download -json sigs.k8s.io/kwok | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[[ -n "$KWOK_MOD" && -d "$KWOK_MOD/kustomize/stage" ]] || die "cannot find the sigs.k8s.io/kwok module (go mod download)"
kwok_configs=()
for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
         pod/fast/pod-ready pod/fast/pod-delete; do
  [[ -f "$KWOK_MOD/kustomize/stage/$f.yaml" ]] || die "kwok module has no kustomize/stage/$f.yaml"
  kwok_configs+=("--config=$KWOK_MOD/kustomize/stage/$f.yaml")
done
for f in pod-complete pod-fail; do
  kwok_configs+=("--config=$HERE/kwok/$f.yaml")
done
start kwok \
  --kubeconfig="$KC" \
  "${kwok_configs[@]}" \
  --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --node-lease-duration-seconds=40 \
  --node-ip=10.244.0.1 --cidr=10.244.0.0/16

k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: $NODE
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/arch: amd64
    kubernetes.io/hostname: $NODE
    kubernetes.io/os: linux
    node-role.kubernetes.io/agent: ""
    pullman.dev/node: kwok
    type: kwok
spec: {}
EOF

wait_for "namespace default" kube-apiserver k get namespace default
wait_for "serviceaccount default/default" kube-controller-manager k get serviceaccount default -n default
alive kube-scheduler || die "kube-scheduler exited (see $STATE/logs/kube-scheduler.log)"
wait_for "node $NODE Ready" kwok k wait --for=condition=Ready "node/$NODE" --timeout=2s
wait_for "node lease kube-node-lease/$NODE" kwok k get lease -n kube-node-lease "$NODE"
if [[ "$REAL_NODE" == 1 ]]; then
  STATE="$STATE" BIN="$BIN" KC="$KC" "$HERE/node.sh" up
fi

trap - EXIT
log "control plane up in $(elapsed)s; state in $STATE, logs in $STATE/logs"
echo "export KUBECONFIG=$KC"
