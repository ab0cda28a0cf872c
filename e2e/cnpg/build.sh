#!/usr/bin/env bash
# Build CloudNativePG's manager (operator and instance manager in one binary) from its Go module,
# once, into ${PULLMAN_TESTENV_CACHE:-~/.cache/pullman-testenv}/cnpg-<version>/bin/manager.
# The version and checksums are pinned by e2e/testenv/tools/cnpg/go.mod and go.sum (the one place
# to bump them). Prints the bin directory as the last line on stdout; its file `cnpg` names the
# module's directory in the Go module cache, where e2e/cnpg/platform.sh takes the CRDs from
# (never from a copy here). Static (CGO_ENABLED=0): the same file runs on the host as the
# operator and in each PostgreSQL pod, copied there by CloudNativePG's bootstrap init container.
# e2e/run-tests.sh starts it early in the background; the lock makes a second run wait.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MOD="$HERE/../testenv/tools/cnpg"
LOG_AS=cnpg/build.sh
# shellcheck source=../lib/gobuild.sh
. "$HERE/../lib/gobuild.sh"
need_go CloudNativePG

VER="$(go_mod_version "$MOD" github.com/cloudnative-pg/cloudnative-pg)"
[[ -n "$VER" ]] || { log "cannot read CloudNativePG's version from $MOD/go.mod"; exit 1; }
go_cache_bin "cnpg-$VER"
if [[ ! -f "$BIN/.built" ]]; then
  log "building CloudNativePG $VER"
  t0=$SECONDS
  (cd "$MOD" && go build -trimpath -ldflags "-s -w" -o "$BIN/.manager.tmp" \
    github.com/cloudnative-pg/cloudnative-pg/cmd/manager)
  mv "$BIN/.manager.tmp" "$BIN/manager"
  touch "$BIN/.built"
  log "built in $((SECONDS - t0))s"
fi
go_mod_dir "$MOD" github.com/cloudnative-pg/cloudnative-pg > "$BIN/cnpg"
echo "$BIN"
