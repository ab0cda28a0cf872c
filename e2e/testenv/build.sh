#!/usr/bin/env bash
# Build the test control plane binaries (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kwok; the real node's kubelet,
# kube-proxy and CoreDNS; optionally helm) from Go modules into a cache
# directory keyed by version. Only the first build pays; later calls reuse it.
#
# Prints the bin directory as the last line on stdout (everything else goes to
# stderr), so callers can do:  BIN="$(e2e/testenv/build.sh | tail -n1)"
#
# Environment:
#   PULLMAN_TESTENV_CACHE  cache root (default: $HOME/.cache/pullman-testenv)
#   PULLMAN_TESTENV_JOBS   parallel compile jobs (default: 2)
#   PULLMAN_TESTENV_FORCE  set to 1 to rebuild even if the cache is populated
#   PULLMAN_TESTENV_HELM   set to 1 to also build the helm CLI into the bin dir
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.sh
source "$HERE/versions.sh"

log() { echo "build.sh: $*" >&2; }

command -v go >/dev/null || { log "go is not on PATH"; exit 1; }

CACHE_ROOT="${PULLMAN_TESTENV_CACHE:-$HOME/.cache/pullman-testenv}"
DEST="$CACHE_ROOT/${K8S_VERSION}-${ETCD_VERSION}-${KWOK_VERSION}"
BIN="$DEST/bin"
BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
# The real node's (node.sh), stamped apart so a cache from before the real node gains them alone.
NODE_BINARIES=(kubelet kube-proxy coredns)
WANT_HELM="${PULLMAN_TESTENV_HELM:-0}"
FORCE="${PULLMAN_TESTENV_FORCE:-0}"

complete() {
  [[ -f "$DEST/.complete" ]] || return 1
  local b
  for b in "${BINARIES[@]}"; do [[ -x "$BIN/$b" ]] || return 1; done
}
# helm counts only with its stamp: older builds lacked the Kubernetes version (see build_helm).
helm_built() { [[ -x "$BIN/helm" && -f "$BIN/.helm-$HELM_VERSION" ]]; }
node_built() {
  [[ -f "$BIN/.node-$COREDNS_VERSION" ]] || return 1
  local b
  for b in "${NODE_BINARIES[@]}"; do [[ -x "$BIN/$b" ]] || return 1; done
}
# Without the real node (PULLMAN_TESTENV_REAL_NODE=0) its binaries are not needed.
want_node() { [[ "${PULLMAN_TESTENV_REAL_NODE:-1}" != 0 ]]; }
satisfied() { complete && { ! want_node || node_built; } && { [[ "$WANT_HELM" != 1 ]] || helm_built; }; }

if [[ "$FORCE" != 1 ]] && satisfied; then
  log "using cached binaries in $BIN"
  echo "$BIN"
  exit 0
fi

mkdir -p "$CACHE_ROOT"
# Serialise concurrent builds of the same cache entry.
exec 9>"$CACHE_ROOT/.build.lock"
if command -v flock >/dev/null; then flock 9; fi
if [[ "$FORCE" != 1 ]] && satisfied; then
  log "using cached binaries in $BIN (built concurrently)"
  echo "$BIN"
  exit 0
fi

export CGO_ENABLED=0
# -mod=readonly: modules are fetched from the proxy as needed and verified
# against the checked-in go.sum; go.mod/go.sum are never rewritten.
export GOFLAGS="-mod=readonly -p=${PULLMAN_TESTENV_JOBS:-2} -buildvcs=false"
# Keep the toolchain we have: the wrapper modules need go >= 1.26.0.
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

build_helm() { # build_helm <dest-file>
  log "building helm $HELM_VERSION"
  # As helm's Makefile does: the Kubernetes version `helm template` and `helm lint` assume is
  # 1.<minor of client-go> (otherwise 1.20, which fails charts that require a newer kubeVersion).
  local minor ld
  minor="$(cd "$HERE/tools/helm" && go list -m -f '{{.Version}}' k8s.io/client-go | cut -d. -f2)"
  ld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ld+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$minor"
  done
  (cd "$HERE/tools/helm" && go build -trimpath -ldflags "$ld" -o "$1" helm.sh/helm/v3/cmd/helm)
  touch "$(dirname "$1")/.helm-$HELM_VERSION"
}

K8S_MINOR="${K8S_VERSION#v1.}"; K8S_MINOR="${K8S_MINOR%%.*}"
K8S_LDFLAGS="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  K8S_LDFLAGS+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$K8S_MINOR"
  K8S_LDFLAGS+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done

build_node() { # build_node <dir>: kubelet and kube-proxy (same module as the API server), CoreDNS
  log "building kubelet, kube-proxy $K8S_VERSION and coredns $COREDNS_VERSION"
  (cd "$HERE/tools/k8s" && go build -trimpath -ldflags "$K8S_LDFLAGS" -o "$1/" \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)
  (cd "$HERE/tools/coredns" && go build -trimpath -ldflags "-s -w" -o "$1/coredns" .)
  touch "$1/.node-$COREDNS_VERSION"
}

start=$(date +%s)

if [[ "$FORCE" != 1 ]] && complete; then
  # The control plane is cached; only the real node's binaries or helm are missing.
  if want_node && ! node_built; then
    build_node "$BIN"
    echo "COREDNS_VERSION=$COREDNS_VERSION" >> "$DEST/versions"
  fi
  if [[ "$WANT_HELM" == 1 ]] && ! helm_built; then
    build_helm "$BIN/.helm.tmp"
    mv "$BIN/.helm.tmp" "$BIN/helm"
    echo "HELM_VERSION=$HELM_VERSION" >> "$DEST/versions"
  fi
  log "completed the cache in $(( $(date +%s) - start ))s into $BIN"
  echo "$BIN"
  exit 0
fi

TMP="$(mktemp -d "$CACHE_ROOT/.build.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
chmod 755 "$TMP"
mkdir -p "$TMP/bin"

# --- Kubernetes control plane -------------------------------------------
log "building kube-apiserver, kube-controller-manager, kube-scheduler $K8S_VERSION"
(cd "$HERE/tools/k8s" && go build -trimpath -ldflags "$K8S_LDFLAGS" -o "$TMP/bin/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler)

# --- etcd ------------------------------------------------------------------
log "building etcd $ETCD_VERSION"
(cd "$HERE/tools/etcd" && go build -trimpath \
  -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" \
  -o "$TMP/bin/etcd" .)

# --- kwok ------------------------------------------------------------------
log "building kwok $KWOK_VERSION"
(cd "$HERE/tools/kwok" && go build -trimpath \
  -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v} -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${K8S_VERSION#v}" \
  -o "$TMP/bin/kwok" sigs.k8s.io/kwok/cmd/kwok)

# --- the real node -----------------------------------------------------------
build_node "$TMP/bin"

# --- helm (optional) -------------------------------------------------------
if [[ "$WANT_HELM" == 1 ]]; then build_helm "$TMP/bin/helm"; fi

{
  echo "K8S_VERSION=$K8S_VERSION"
  echo "ETCD_VERSION=$ETCD_VERSION"
  echo "KWOK_VERSION=$KWOK_VERSION"
  echo "COREDNS_VERSION=$COREDNS_VERSION"
  if [[ "$WANT_HELM" == 1 ]]; then echo "HELM_VERSION=$HELM_VERSION"; fi
  echo "GO_VERSION=$(go env GOVERSION)"
} > "$TMP/versions"
touch "$TMP/.complete"

rm -rf "$DEST"
mv "$TMP" "$DEST"
trap - EXIT
log "built in $(( $(date +%s) - start ))s into $BIN"
echo "$BIN"
