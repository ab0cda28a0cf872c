#!/usr/bin/env bash
# Tests of the Helm chart (charts/pullman) on the test control plane (e2e/testenv: a real
# kube-apiserver with RBAC and Pod Security admission, kwok playing the kubelet):
#   1. static: CRD copy identical to crds/, helm lint --strict, the schema refusing typos and wrong
#      types, value combinations refused with a message, PrometheusRule expressions parsed
#      (promrules), workflows checked (actionlint), kube-score on every documented mode with
#      each finding either gone or listed in the chart README;
#   2. every documented mode rendered and accepted by the API server (--dry-run=server), with
#      and without networkPolicy; anti-affinity, resources and NetworkPolicy rules as rendered;
#   3. helm install --wait into namespaces enforcing the `restricted` Pod Security Standard,
#      cluster-wide (a first install on a cluster without the CRDs: Executors exist at once) and
#      namespaced; helm test; helm upgrade keeping the admin and agent tokens;
#   4. RBAC for real: `pullman serve` and `pullman executor` run on this machine with the tokens of
#      the chart's ServiceAccounts and take the pi Job WorkOrder to Succeeded and an Executor with
#      `deployment` to Ready; any 403 in their logs fails the test; the agent-only mode likewise;
#   5. uninstall as the chart README documents it;
#   6. Helm 4: a first install with executors, each Executor Ready with the server running as the
#      chart's ServiceAccount.
#
# Needs KUBECONFIG pointing at the test control plane (e2e/run-tests.sh starts it) and the pullman
# binary (PULLMAN_BIN, default target/debug/pullman). Usage: e2e/chart/test.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
CHART=charts/pullman
: "${KUBECONFIG:?KUBECONFIG must point at the test control plane (e2e/testenv/up.sh)}"
PULLMAN="${PULLMAN_BIN:-$ROOT/target/debug/pullman}"
[[ -x "$PULLMAN" ]] || { echo "no pullman binary at $PULLMAN (cargo build first)" >&2; exit 1; }

BIN="$(e2e/chart/tools.sh | tail -n1)"
HELM="$BIN/helm"
WORK="$(mktemp -d /tmp/pullman-chart-test.XXXXXX)"
chmod 755 "$WORK"   # the embedded PostgreSQL runs as `postgres` when we are root; files stay 0600
PIDS=()
stop_pids() { # stop_pids <pid...>: SIGTERM, then SIGKILL after 10 s (an executor drains its claims)
  local pid alive deadline=$((SECONDS + 10))
  for pid in "$@"; do kill "$pid" 2>/dev/null || true; done
  while (( SECONDS < deadline )); do
    alive=0
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    (( alive )) || break
    sleep 0.2
  done
  for pid in "$@"; do kill -9 "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
}
cleanup() {
  stop_pids "${PIDS[@]}"
  if [[ "${KEEP_WORK:-0}" != 1 ]]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT

SUITE=chart
# shellcheck source=e2e/lib/check.sh
source "$ROOT/e2e/lib/check.sh"
helm() { "$HELM" "$@"; }
# shellcheck source=e2e/chart/lib.sh
source e2e/chart/lib.sh
# shellcheck source=e2e/chart/static.sh
source e2e/chart/static.sh
# shellcheck source=e2e/chart/install.sh
source e2e/chart/install.sh
finish
