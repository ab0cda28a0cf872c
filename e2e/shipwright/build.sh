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
LOG_AS=shipwright/build.sh
# shellcheck source=../lib/gobuild.sh
. "$HERE/../lib/gobuild.sh"
need_go "Tekton and Shipwright"

SHP="$(go_mod_version "$MOD" github.com/shipwright-io/build)"
TKN="$(go_mod_version "$MOD" github.com/tektoncd/pipeline)"
KNK="$(go_mod_version "$KMOD" github.com/chainguard-dev/kaniko)"
[[ -n "$SHP" && -n "$TKN" && -n "$KNK" ]] \
  || { log "cannot read the Shipwright, Tekton and kaniko versions from $MOD/go.mod and $KMOD/go.mod"; exit 1; }
go_cache_bin "shipwright-$SHP-tekton-$TKN-kaniko-$KNK"
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
go_mod_dir "$MOD" github.com/tektoncd/pipeline > "$BIN/tekton"
go_mod_dir "$MOD" github.com/shipwright-io/build > "$BIN/shipwright"
echo "$BIN"
