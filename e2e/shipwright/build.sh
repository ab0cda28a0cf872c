#!/usr/bin/env bash
# Build Tekton Pipelines' controller and build-pod helpers, Shipwright's build controller and
# steps, crane, and kaniko's executor, from their Go modules, once, into
# ${PULLMAN_TESTENV_CACHE:-~/.cache/pullman-testenv}/shipwright-<shipwright>-tekton-<tekton>-kaniko-<kaniko>/bin.
# Versions and checksums are pinned by e2e/testenv/tools/shipwright/go.mod (Tekton, Shipwright,
# crane) and e2e/testenv/tools/kaniko/go.mod, with their go.sum files (the one place to bump them). Prints the bin directory as the last line on stdout; its files `tekton`
# and `shipwright` name the two modules' directories in the Go module cache, where
# e2e/shipwright/platform.sh takes their CRDs and configuration from (never from a copy here).
#
# Cold (empty Go module and build caches), on 2 cores: Tekton, Shipwright and crane 171 s (~5
# CPU-minutes, 1.5 GB of modules through the proxy, 1.4 GB of build cache), kaniko 85 s (~2.5
# CPU-minutes, 1.5 GB of modules, 0.5 GB of build cache; v1.23.2, before Chainguard's fork). e2e/run-tests.sh starts it early in the
# background, like KEDA's; the lock makes a second run wait and find the binaries.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MOD="$HERE/../testenv/tools/shipwright"
KMOD="$HERE/../testenv/tools/kaniko"
log() { echo "shipwright/build.sh: $*" >&2; }
command -v go >/dev/null || { log "Go >= 1.26 is required to build Tekton and Shipwright"; exit 1; }

modver() { awk -v m="$2" '$1 == m { print $2; exit }' "$1/go.mod"; }
SHP="$(modver "$MOD" github.com/shipwright-io/build)"
TKN="$(modver "$MOD" github.com/tektoncd/pipeline)"
KNK="$(modver "$KMOD" github.com/chainguard-dev/kaniko)"
[[ -n "$SHP" && -n "$TKN" && -n "$KNK" ]] \
  || { log "cannot read the Shipwright, Tekton and kaniko versions from $MOD/go.mod and $KMOD/go.mod"; exit 1; }
BIN="${PULLMAN_TESTENV_CACHE:-$HOME/.cache/pullman-testenv}/shipwright-$SHP-tekton-$TKN-kaniko-$KNK/bin"
mkdir -p "$BIN"
exec 9>"$BIN/.build.lock"
if command -v flock >/dev/null; then flock 9; fi

export CGO_ENABLED=0 GOTOOLCHAIN="${GOTOOLCHAIN:-local}" \
  GOFLAGS="-mod=readonly -p=${PULLMAN_TESTENV_JOBS:-2} -buildvcs=false"
tools=(
  github.com/tektoncd/pipeline/cmd/controller
  github.com/tektoncd/pipeline/cmd/entrypoint
  github.com/tektoncd/pipeline/cmd/nop
  github.com/tektoncd/pipeline/cmd/sidecarlogresults
  github.com/tektoncd/pipeline/cmd/workingdirinit
  github.com/shipwright-io/build/cmd/shipwright-build-controller
  github.com/shipwright-io/build/cmd/image-processing
  github.com/shipwright-io/build/cmd/waiter
  github.com/shipwright-io/build/cmd/bundle
  github.com/google/go-containerregistry/cmd/crane
)
if [[ ! -f "$BIN/.built" ]]; then
  log "building Tekton $TKN, Shipwright $SHP and kaniko $KNK (cold: ~4.5 min on 2 cores)"
  t0=$SECONDS
  rm -rf "$BIN/.tmp" && mkdir "$BIN/.tmp"
  # One `go build` for the ten of one module: they share most packages, each compiled once.
  (cd "$MOD" && go build -trimpath -ldflags "-s -w" -o "$BIN/.tmp/" "${tools[@]}")
  (cd "$KMOD" && go build -trimpath -ldflags "-s -w" -o "$BIN/.tmp/kaniko-executor" \
    github.com/chainguard-dev/kaniko/cmd/executor)
  # Tekton's `controller` keeps a name that says whose it is.
  mv "$BIN/.tmp/controller" "$BIN/.tmp/tekton-controller"
  mv "$BIN/.tmp/"* "$BIN/"
  rm -rf "$BIN/.tmp"
  touch "$BIN/.built"
  log "built in $((SECONDS - t0))s"
fi
moddir() { (cd "$MOD" && go mod download -json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'); }
moddir github.com/tektoncd/pipeline > "$BIN/tekton"
moddir github.com/shipwright-io/build > "$BIN/shipwright"
echo "$BIN"
