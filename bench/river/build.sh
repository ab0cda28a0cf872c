#!/usr/bin/env bash
# Builds the River benchmark peer (bench/river/main.go, scenario `river` of bench/queue.rs) from its
# Go module, once, into ${PULLMAN_BENCH_CACHE:-~/.cache/pullman-bench}/river-<version>/river.
# River's version and every checksum are pinned by bench/river/go.mod and go.sum (the one place:
# the version is read from go.mod). Rebuilt only when go.mod, go.sum or main.go change (a stamp
# holds their hash). Prints the binary's path as the last line on stdout; a lock makes a second
# caller wait for the first and find the binary.
#
# Cold (empty module and build caches): about 25 MB of modules from the Go module proxy and
# under a minute of CPU.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
log() { echo "river/build.sh: $*" >&2; }
command -v go >/dev/null || { log "Go >= 1.26 is required to build the River benchmark peer"; exit 1; }

VERSION="$(awk '$1 == "github.com/riverqueue/river" || ($1 == "require" && $2 == "github.com/riverqueue/river") { print ($1 == "require") ? $3 : $2; exit }' "$HERE/go.mod")"
[[ -n "$VERSION" ]] || { log "cannot read River's version from $HERE/go.mod"; exit 1; }
DEST="${PULLMAN_BENCH_CACHE:-$HOME/.cache/pullman-bench}/river-$VERSION"
mkdir -p "$DEST"
exec 9>"$DEST/.build.lock"
if command -v flock >/dev/null; then flock 9; fi

key="$(cat "$HERE/go.mod" "$HERE/go.sum" "$HERE/main.go" | sha256sum | cut -c1-16)"
if [[ ! -x "$DEST/river" || ! -f "$DEST/.river-$key" ]]; then
  log "building the River $VERSION benchmark peer into $DEST"
  t0=$SECONDS
  # -mod=readonly: modules must match the checked-in go.sum; nothing is rewritten.
  (cd "$HERE" && CGO_ENABLED=0 GOTOOLCHAIN="${GOTOOLCHAIN:-local}" \
    GOFLAGS="-mod=readonly -buildvcs=false -p=${PULLMAN_TESTENV_JOBS:-2}" \
    go build -trimpath -ldflags "-s -w" -o "$DEST/.river.tmp" .)
  mv "$DEST/.river.tmp" "$DEST/river"
  rm -f "$DEST/.river-"*
  touch "$DEST/.river-$key"
  log "built in $((SECONDS - t0))s"
fi
echo "$DEST/river"
