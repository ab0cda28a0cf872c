#!/usr/bin/env bash
# Build the chart tests' tools from Go modules, once, into the test control plane's cache:
# helm 3 (through e2e/testenv/build.sh), helm 4 (`helm4`), actionlint (GitHub Actions workflows),
# promrules (the Prometheus rule-file checker of promtool) and kube-score (the object linter many
# teams gate charts with). Versions and checksums are pinned by the go.mod /
# go.sum files under e2e/testenv/tools/. Prints the bin directory as the last line on stdout.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TOOLS="$HERE/../testenv/tools"
LOG_AS=tools.sh
# shellcheck source=../lib/gobuild.sh
. "$HERE/../lib/gobuild.sh"

BIN="$(PULLMAN_TESTENV_HELM=1 "$HERE/../testenv/build.sh" | tail -n1)"

modver() { go_mod_version "$TOOLS/$1" "$2"; }

build_tool() { # build_tool <name> <module dir> <package> <version> [ldflags]
  local name="$1" dir="$2" pkg="$3" version="$4" ld="-s -w ${5:-}" stamp
  stamp="$BIN/.$name-$version"
  if [[ -x "$BIN/$name" && -f "$stamp" ]]; then return; fi
  log "building $name $version"
  local t0=$SECONDS
  (cd "$dir" && go_env && go build -trimpath -ldflags "$ld" -o "$BIN/.$name.tmp" "$pkg")
  mv "$BIN/.$name.tmp" "$BIN/$name"
  rm -f "$BIN/.$name-"*
  touch "$stamp"
  log "built $name in $((SECONDS - t0))s"
}

exec 9>"$BIN/.tools.lock"
if command -v flock >/dev/null; then flock 9; fi
build_tool actionlint "$TOOLS/actionlint" github.com/rhysd/actionlint/cmd/actionlint \
  "$(modver actionlint github.com/rhysd/actionlint)"
HELM4_VERSION="$(modver helm4 helm.sh/helm/v4)"
build_tool helm4 "$TOOLS/helm4" helm.sh/helm/v4/cmd/helm "$HELM4_VERSION" \
  "-X helm.sh/helm/v4/internal/version.version=$HELM4_VERSION -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
build_tool promrules "$TOOLS/promrules" . "$(modver promrules github.com/prometheus/prometheus)"
KUBE_SCORE_VERSION="$(modver kube-score github.com/zegl/kube-score)"
build_tool kube-score "$TOOLS/kube-score" github.com/zegl/kube-score/cmd/kube-score "$KUBE_SCORE_VERSION" \
  "-X main.version=$KUBE_SCORE_VERSION"
echo "$BIN"
