#!/usr/bin/env bash
# Pullman in real pods on the test control plane's real node (e2e/testenv/node.sh): imports the
# image made from the pullman binary (e2e/testenv/images.sh: the Dockerfile's recipe), starts a
# PostgreSQL on this machine where pods reach it (the node's bridge address), and runs the shared
# scenario (e2e/scenario/run.sh) with the chart's pods, the executor's and the Jobs' placed on the
# real node. The runtime proof of the security context reads each container's process here
# (pod-check.sh).
#
# Needs KUBECONFIG and PULLMAN_TESTENV_STATE of a running test control plane with its real node
# (e2e/run-tests.sh starts it), helm (e2e/chart/tools.sh builds it) and the pullman binary
# (PULLMAN_BIN, default target/debug/pullman). Figures are appended to PULLMAN_FIGURES if set.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
HERE="$ROOT/e2e/realnode"
: "${KUBECONFIG:?KUBECONFIG must point at the test control plane (e2e/testenv/up.sh)}"
STATE="${PULLMAN_TESTENV_STATE:-/tmp/pullman-testenv}"
PULLMAN="${PULLMAN_BIN:-$ROOT/target/debug/pullman}"
log() { echo "realnode: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# One line for each thing that is not there, instead of a timeout later.
[[ -x "$PULLMAN" ]] || die "no pullman binary at $PULLMAN (cargo build --bin pullman)"
[[ -S "$STATE/node/containerd.sock" ]] || die "no real node in $STATE: containerd's socket is missing (start the test control plane with e2e/testenv/up.sh, PULLMAN_TESTENV_REAL_NODE=1)"
kill -0 "$(cat "$STATE/pids/containerd.pid" 2>/dev/null)" 2>/dev/null || die "containerd of the real node is not running (log: $STATE/logs/containerd.log)"
node="$(kubectl get nodes -l pullman.dev/node=real -o jsonpath='{.items[*].metadata.name}')"
node="${node%% *}"
[[ -n "$node" ]] || die "no node labelled pullman.dev/node=real"
[[ "$(kubectl get node "$node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]] \
  || die "node $node is not Ready (log: $STATE/logs/kubelet.log)"
PG_BIN="$(dirname "$(readlink -f "$(command -v initdb 2>/dev/null || ls /usr/lib/postgresql/*/bin/initdb | sort -V | tail -n1)")")"
[[ -x "$PG_BIN/postgres" ]] || die "no PostgreSQL server binaries (apt install postgresql)"
HELM_BIN="$(e2e/chart/tools.sh | tail -n1)"
# Its PostgreSQL lives as long as this script: a second run would find pods of the first holding
# a database that is gone.
kubectl get namespace scenario-system >/dev/null 2>&1 \
  && die "namespace scenario-system exists: the scenario runs once per test control plane (e2e/testenv/down.sh, then up.sh)"


WORK="$(mktemp -d /tmp/pullman-realnode.XXXXXX)"
chmod 755 "$WORK"
PG_PID=""
cleanup() {
  set +e
  # The release and the scenario's namespaces go before their database: left running, its pods
  # would probe a PostgreSQL that is gone for the rest of the run, beside the later suites.
  # The demo namespace first, while the controller is there to clear its objects' finalizers.
  if [[ -n "${NS:-}" ]]; then
    kubectl delete namespace scenario-demo --ignore-not-found --timeout=30s >/dev/null 2>&1
    "$HELM_BIN/helm" uninstall pullman -n "$NS" --timeout 60s >/dev/null 2>&1
    kubectl delete namespace "$NS" --ignore-not-found --wait=false >/dev/null 2>&1
  fi
  # The postmaster itself (runuser does not pass signals on): immediate shutdown, which does not
  # wait for the serve pods' connections to close, and a bounded wait.
  if [[ -f "$WORK/pg/data/postmaster.pid" ]]; then
    local pid i
    pid="$(head -n1 "$WORK/pg/data/postmaster.pid")"
    kill -QUIT "$pid" 2>/dev/null
    for (( i = 0; i < 100; i++ )); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# The Dockerfile and the local image are one recipe: the Dockerfile's last stage is the file
# system config/image/rootfs.sh makes, in an empty image, with the user and entrypoint that
# images.sh reads from it. pod-check.sh then finds that file system in every Pullman container.
dockerfile_final="$(awk '/^FROM /{ stage = "" } { stage = stage $0 "\n" } END { printf "%s", stage }' Dockerfile | grep -v '^#' | grep -v '^$')"
expected_final='FROM scratch
COPY --from=build /rootfs /
USER 65532
ENTRYPOINT ["/usr/local/bin/pullman"]'
[[ "$dockerfile_final" == "$expected_final" ]] || die "the Dockerfile's last stage is no longer the rootfs.sh file system with user 65532 and entrypoint /usr/local/bin/pullman:
$dockerfile_final"
grep -q 'config/image/rootfs.sh target/release/pullman /rootfs' Dockerfile || die "the Dockerfile's build stage does not make /rootfs with config/image/rootfs.sh"
config/image/rootfs.sh "$PULLMAN" "$WORK/rootfs"
(cd "$WORK/rootfs" && find . -type f | sort) > "$WORK/expected-files"
export EXPECTED_FILES="$WORK/expected-files"

log "importing localhost/pullman:dev from $PULLMAN"
STATE="$STATE" e2e/testenv/images.sh pullman "$PULLMAN"
refs="$(ctr --address "$STATE/node/containerd.sock" --namespace k8s.io images ls -q)"
for image in localhost/pause:dev localhost/busybox:dev localhost/pullman:dev; do
  grep -qx "$image" <<<"$refs" || die "image $image is not in the real node's containerd (e2e/testenv/images.sh)"
done

# PostgreSQL on the bridge address: pods reach this machine and nothing else.
GATEWAY=10.88.0.1
PG_PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("10.88.0.1", 0)); print(s.getsockname()[1])')"
PG_PASSWORD="$(openssl rand -hex 16)"
as_pg() { if [[ "$(id -u)" == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }
mkdir -p "$WORK/pg"; chown postgres "$WORK/pg" 2>/dev/null || true
# The superuser's password, readable by postgres alone, and only while initdb reads it.
(umask 077; echo "$PG_PASSWORD" > "$WORK/pg/pw"); chown postgres "$WORK/pg/pw" 2>/dev/null || true
as_pg "$PG_BIN/initdb" -D "$WORK/pg/data" -U pullman --pwfile="$WORK/pg/pw" --auth=scram-sha-256 >/dev/null
rm -f "$WORK/pg/pw"
echo "host all all 10.88.0.0/16 scram-sha-256" >> "$WORK/pg/data/pg_hba.conf"
as_pg "$PG_BIN/postgres" -D "$WORK/pg/data" -c listen_addresses="$GATEWAY" -p "$PG_PORT" \
  -c unix_socket_directories="$WORK/pg" -c fsync=off >"$WORK/pg.log" 2>&1 &
PG_PID=$!
for _ in $(seq 1 60); do
  [[ -S "$WORK/pg/.s.PGSQL.$PG_PORT" ]] && break
  kill -0 "$PG_PID" 2>/dev/null || { cat "$WORK/pg.log" >&2; die "PostgreSQL did not start"; }
  sleep 0.5
done
[[ -S "$WORK/pg/.s.PGSQL.$PG_PORT" ]] || { cat "$WORK/pg.log" >&2; die "PostgreSQL did not listen within 30 s"; }

NS=scenario-system
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl create secret generic pullman-db -n "$NS" \
  --from-literal=uri="postgres://pullman:$PG_PASSWORD@$GATEWAY:$PG_PORT/postgres" \
  --dry-run=client -o yaml | kubectl apply -f - >/dev/null
PLACEMENT='{"nodeSelector": {"pullman.dev/node": "real"}, "tolerations": [{"key": "pullman.dev/node", "operator": "Equal", "value": "real", "effect": "NoSchedule"}]}'
cat > "$WORK/values.yaml" <<YAML
image: {repository: localhost/pullman, tag: dev, pullPolicy: Never}
database: {existingSecret: pullman-db}
server:
  logFormat: text
  nodeSelector: {pullman.dev/node: real}
  tolerations: [{key: pullman.dev/node, operator: Equal, value: real, effect: NoSchedule}]
tests:
  image: localhost/busybox:dev
YAML

SCENARIO_VALUES="$WORK/values.yaml" SCENARIO_PLACEMENT="$PLACEMENT" SCENARIO_IMAGE=localhost/busybox:dev \
SCENARIO_SERVE_URL=service SCENARIO_POD_CHECK="$HERE/pod-check.sh" SCENARIO_NS="$NS" \
SCENARIO_RESTART_APISERVER="$(printf 'PULLMAN_TESTENV_STATE=%q %q kube-apiserver 2 KILL' "$STATE" "$ROOT/e2e/testenv/restart.sh")" \
SCENARIO_DEMO_NS=scenario-demo SCENARIO_FIGURES="${PULLMAN_FIGURES:-}" HELM="$HELM_BIN/helm" \
PULLMAN_BIN="$PULLMAN" STATE="$STATE" \
  e2e/scenario/run.sh
