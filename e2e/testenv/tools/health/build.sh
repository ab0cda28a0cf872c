#!/usr/bin/env bash
# Builds the `health` test helper (main.go: kstatus and Argo CD Lua verdicts on an object) into a
# cache directory keyed by the hash of its sources, so only the first call compiles. Prints the
# binary's path as the last line on stdout; e2e/run-tests.sh exports it as PULLMAN_HEALTH_TOOL
# for tests/k8s_health.rs.
#
# Environment: PULLMAN_TESTENV_CACHE (cache root, default $HOME/.cache/pullman-testenv).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v go >/dev/null || { echo "health/build.sh: go is not on PATH" >&2; exit 1; }
key="$(cat "$HERE/go.mod" "$HERE/go.sum" "$HERE/main.go" | sha256sum | cut -c1-16)"
dest="${PULLMAN_TESTENV_CACHE:-$HOME/.cache/pullman-testenv}/health-$key"
if [[ ! -x "$dest/health" ]]; then
  mkdir -p "$dest"
  echo "health/build.sh: building the health helper into $dest" >&2
  # -mod=readonly: modules must match the checked-in go.sum; nothing is rewritten.
  (cd "$HERE" && CGO_ENABLED=0 GOTOOLCHAIN="${GOTOOLCHAIN:-local}" \
    GOFLAGS="-mod=readonly -buildvcs=false -p=${PULLMAN_TESTENV_JOBS:-2}" \
    go build -trimpath -ldflags "-s -w" -o "$dest/.health.tmp" .)
  mv "$dest/.health.tmp" "$dest/health"
fi
echo "$dest/health"
