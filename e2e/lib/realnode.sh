# shellcheck shell=bash
# The preamble of the suites on the test control plane's real node (e2e/realnode/disruptions.sh,
# e2e/shipwright/test.sh, e2e/cnpg/test.sh), in one place. Source it after e2e/lib/check.sh
# (it calls fail and k) and the suite's own check of KUBECONFIG (whose message names the suite),
# from the repository's root. Sourcing it:
#   - exports PULLMAN_TESTENV_STATE (default /tmp/pullman-testenv), which e2e/testenv's scripts read;
#   - sets PULLMAN to the pullman binary (PULLMAN_BIN, default target/debug/pullman) and fails the
#     suite when it is not there.
# Then:
#   real_node    sets node to the name of the node labelled pullman.dev/node=real, else fails
#   admin ARGS…  curl as the admin (PULLMAN_ADMIN_TOKEN), JSON bodies, the body of a 4xx/5xx shown
export PULLMAN_TESTENV_STATE="${PULLMAN_TESTENV_STATE:-/tmp/pullman-testenv}"
PULLMAN="${PULLMAN_BIN:-$PWD/target/debug/pullman}"
[[ -x "$PULLMAN" ]] || fail "no pullman binary at $PULLMAN (cargo build --bin pullman)"

real_node() {
  node="$(k get nodes -l pullman.dev/node=real -o jsonpath='{.items[*].metadata.name}')"
  node="${node%% *}"
  [[ -n "$node" ]] || fail "no node labelled pullman.dev/node=real (PULLMAN_TESTENV_REAL_NODE=1)"
}
admin() { curl -sS --fail-with-body -H "Authorization: Bearer $PULLMAN_ADMIN_TOKEN" -H 'content-type: application/json' "$@"; }
