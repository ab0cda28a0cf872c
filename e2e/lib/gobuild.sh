# shellcheck shell=bash
# What the Go builds of the suites' third-party tools (e2e/cnpg/build.sh, e2e/keda/build.sh,
# e2e/shipwright/build.sh, e2e/chart/tools.sh) share, in one place. Set LOG_AS (the name their
# lines on stderr start with) and source this file; then:
#   log WHAT                      "LOG_AS: WHAT" on stderr
#   need_go WHAT                  without go on PATH: "Go >= 1.26 is required to build WHAT", exit 1
#   go_mod_version MODDIR MODULE  the version MODDIR/go.mod requires MODULE at ("MODULE v" in a
#                                 require block or "require MODULE v"); empty if it does not
#   go_mod_dir MODDIR MODULE      MODULE's directory in the Go module cache (`go mod download`),
#                                 where CRDs are taken from (never from a copy in this repository)
#   go_env                        exports the build's environment: static (CGO_ENABLED=0), the
#                                 local toolchain unless GOTOOLCHAIN says otherwise, modules as
#                                 go.sum pins them (-mod=readonly), PULLMAN_TESTENV_JOBS (2) jobs
#   go_cache_bin NAME             BIN=${PULLMAN_TESTENV_CACHE:-~/.cache/pullman-testenv}/NAME/bin,
#                                 made if missing; takes its lock (BIN/.build.lock on fd 9, held
#                                 until the script exits, so a second run waits and finds the
#                                 binaries), then go_env
# The test control plane's own build (e2e/testenv/build.sh) and the health helper
# (e2e/testenv/tools/health/build.sh) keep theirs: one cache directory for many tools, keyed otherwise.
: "${LOG_AS:?set LOG_AS before sourcing e2e/lib/gobuild.sh}"

log() { echo "$LOG_AS: $*" >&2; }
need_go() { command -v go >/dev/null || { log "Go >= 1.26 is required to build $1"; exit 1; }; }
go_mod_version() {
  awk -v m="$2" '$1 == m || ($1 == "require" && $2 == m) { print ($1 == "require") ? $3 : $2; exit }' "$1/go.mod"
}
go_mod_dir() {
  (cd "$1" && go mod download -json "$2" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
}
go_env() {
  export CGO_ENABLED=0 GOTOOLCHAIN="${GOTOOLCHAIN:-local}" \
    GOFLAGS="-mod=readonly -p=${PULLMAN_TESTENV_JOBS:-2} -buildvcs=false"
}
go_cache_bin() {
  BIN="${PULLMAN_TESTENV_CACHE:-$HOME/.cache/pullman-testenv}/$1/bin"
  mkdir -p "$BIN"
  exec 9>"$BIN/.build.lock"
  if command -v flock >/dev/null; then flock 9; fi
  go_env
}
