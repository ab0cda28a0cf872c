#!/usr/bin/env bash
# Build the KEDA operator and its metrics adapter (github.com/kedacore/keda/v2/cmd/operator, cmd/adapter)
# from their Go module, once, into
# ${PULLMAN_TESTENV_CACHE:-~/.cache/pullman-testenv}/keda-<version>/bin. The version and every
# checksum are pinned by e2e/testenv/tools/keda/go.mod and go.sum. Prints the bin directory as the
# last line on stdout; its `crds` file names KEDA's CRD directory in the Go module cache.
#
# Cold (empty Go module and build caches): ~300 MB of modules, 3.3 GB of build cache, ~17.5
# CPU-minutes (e2e/keda/README.md). .ci/run and e2e/run-tests.sh start it early, in the background,
# so it overlaps the other builds; the lock (go_cache_bin) makes a second run wait and find the binary.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MOD="$HERE/../testenv/tools/keda"
LOG_AS=keda/build.sh
# shellcheck source=../lib/gobuild.sh
. "$HERE/../lib/gobuild.sh"
need_go "the KEDA operator"

VERSION="$(go_mod_version "$MOD" github.com/kedacore/keda/v2)"
[[ -n "$VERSION" ]] || { log "cannot read the KEDA version from $MOD/go.mod"; exit 1; }
go_cache_bin "keda-$VERSION"
# Both binaries in one `go build`: the adapter shares most of its packages with the operator, so
# building them together compiles each package once.
if [[ ! -x "$BIN/keda-operator" || ! -x "$BIN/keda-adapter" || ! -f "$BIN/.keda-$VERSION" ]]; then
  log "building the KEDA operator and metrics adapter $VERSION (cold: see e2e/keda/README.md)"
  t0=$SECONDS
  rm -rf "$BIN/.tmp" && mkdir "$BIN/.tmp"
  (cd "$MOD" && go build -trimpath -ldflags "-s -w -X github.com/kedacore/keda/v2/version.Version=$VERSION" \
    -o "$BIN/.tmp/" github.com/kedacore/keda/v2/cmd/operator github.com/kedacore/keda/v2/cmd/adapter)
  mv "$BIN/.tmp/operator" "$BIN/keda-operator"
  mv "$BIN/.tmp/adapter" "$BIN/keda-adapter"
  rm -rf "$BIN/.tmp" "$BIN/.keda-operator-"* "$BIN/.keda-"*
  touch "$BIN/.keda-$VERSION"
  log "built keda-operator and keda-adapter $VERSION in $((SECONDS - t0))s"
fi
# KEDA's CRDs come from the module itself (config/crd/bases), never from a copy in this repository.
dir="$(go_mod_dir "$MOD" github.com/kedacore/keda/v2)"
[[ -d "$dir/config/crd/bases" ]] || { log "no config/crd/bases in $dir"; exit 1; }
echo "$dir/config/crd/bases" > "$BIN/crds"
echo "$BIN"
