#!/usr/bin/env bash
# Build Tekton Pipelines' controller and build-pod helpers, Shipwright's build controller and
# steps, and crane, from their Go modules, once, into
# ${PULLMAN_TESTENV_CACHE:-~/.cache/pullman-testenv}/shipwright-<shipwright>-tekton-<tekton>/bin.
# Versions and checksums are pinned by e2e/testenv/tools/shipwright/go.mod and go.sum (the one
# place to bump them). Prints the bin directory as the last line on stdout; its files `tekton`
# and `shipwright` name the two modules' directories in the Go module cache, where
# e2e/shipwright/platform.sh takes their CRDs and configuration from (never from a copy here).
#
# Cold (empty Go module and build caches): 171 s on 2 cores, ~5 CPU-minutes, 1.5 GB of modules
# downloaded through the proxy and 1.4 GB of build cache. e2e/run-tests.sh starts it early in the
# background, like KEDA's; the lock makes a second run wait and find the binaries.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MOD="$HERE/../testenv/tools/shipwright"
log() { echo "shipwright/build.sh: $*" >&2; }
command -v go >/dev/null || { log "Go >= 1.26 is required to build Tekton and Shipwright"; exit 1; }

modver() { awk -v m="$1" '$1 == m { print $2; exit }' "$MOD/go.mod"; }
SHP="$(modver github.com/shipwright-io/build)"
TKN="$(modver github.com/tektoncd/pipeline)"
[[ -n "$SHP" && -n "$TKN" ]] || { log "cannot read the Shipwright and Tekton versions from $MOD/go.mod"; exit 1; }
BIN="${PULLMAN_TESTENV_CACHE:-$HOME/.cache/pullman-testenv}/shipwright-$SHP-tekton-$TKN/bin"
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
  github.com/google/go-containerregistry/cmd/crane
)
if [[ ! -f "$BIN/.built" ]]; then
  log "building Tekton $TKN and Shipwright $SHP (cold: ~3 min on 2 cores)"
  t0=$SECONDS
  rm -rf "$BIN/.tmp" && mkdir "$BIN/.tmp"
  # One `go build` for all nine: they share most packages, each compiled once.
  (cd "$MOD" && go build -trimpath -ldflags "-s -w" -o "$BIN/.tmp/" "${tools[@]}")
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
