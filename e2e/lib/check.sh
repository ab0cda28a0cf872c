# shellcheck shell=bash
# What the e2e suites (e2e/chart, e2e/scenario, e2e/keda; on the real node e2e/realnode/disruptions.sh,
# e2e/shipwright, e2e/cnpg, whose preamble is e2e/lib/realnode.sh) print, count and call, in one place.
# Set SUITE (the suite's name in its log) and source this file; then:
#   step WHAT                 "==> [SUITE 12s] WHAT": a section of the suite begins
#   ok WHAT                   "    ok: WHAT", counted in PASSED
#   fail WHAT                 "    FAILED: WHAT" on stderr, then the suite's own `diagnose`
#                             function when it defines one, the count, and exit 1
#   finish                    "SUITE: N passed, 0 failed (Ts)": the last line of a suite that passed
#   k ARGS                    kubectl with a 20 s request timeout (a hung API server fails a call,
#                             not the CI job)
#   free_port                 a TCP port free on 127.0.0.1 now
#   jsonf EXPR                a field of the JSON document on stdin: EXPR is Python over `d`
#   until_true SECS WHAT CMD… CMD every second until it succeeds, else fail "WHAT: not within SECS s"
#                             (e2e/keda and e2e/scenario keep variants that say more)
# The test control plane's own scripts (e2e/testenv) keep theirs: they log to stderr for
# `eval "$(up.sh)"`, and their free_port also never hands out a port twice.
: "${SUITE:?set SUITE before sourcing e2e/lib/check.sh}"
T0=$SECONDS
PASSED=0

step() { echo "==> [$SUITE $((SECONDS - T0))s] $*"; }
ok() { PASSED=$((PASSED + 1)); echo "    ok: $*"; }
fail() {
  echo "    FAILED: $*" >&2
  if declare -F diagnose >/dev/null; then diagnose || true; fi
  echo "$SUITE: $PASSED passed, 1 failed ($((SECONDS - T0))s)"
  exit 1
}
finish() { echo "$SUITE: $PASSED passed, 0 failed ($((SECONDS - T0))s)"; }
k() { kubectl --request-timeout=20s "$@"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
jsonf() { python3 -c 'import sys, json; d = json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"; }
until_true() {
  local secs="$1" what="$2" i
  shift 2
  for (( i = 0; i < secs; i++ )); do "$@" && return 0; sleep 1; done
  fail "$what: not within $secs s"
}
