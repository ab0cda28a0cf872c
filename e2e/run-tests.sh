#!/usr/bin/env bash
# Runs the whole test suite: unit tests, the queue and API tests against a throwaway PostgreSQL
# (started by the tests themselves), and the Kubernetes tests against the test control plane
# (e2e/testenv: etcd, kube-apiserver, controller-manager, scheduler, kwok nodes and a real node
# with containerd, kubelet, kube-proxy and CoreDNS), which this script builds on first use
# (cached under ~/.cache/pullman-testenv), starts, and stops again; then the Helm chart's tests
# (e2e/chart/test.sh) on the same control plane, in their own namespaces; then Pullman's own pods
# on the real node (e2e/realnode/test.sh, the scenario e2e/kind/run.sh runs on kind), disruptions
# under running orders there (e2e/realnode/disruptions.sh; schemathesis and the generated client,
# below, run beside them), `build` orders with real Tekton and
# Shipwright controllers building and pushing images there (e2e/shipwright/test.sh), PostgreSQL
# failovers under load from CloudNativePG there (e2e/cnpg/test.sh); KEDA's own
# operator scaling an Executor on its backlog (e2e/keda/test.sh); schemathesis against a real
# `pullman serve` (e2e/schemathesis/run.sh); then a client generated from its OpenAPI document
# with openapi-python-client, checked with mypy --strict and run against a real `pullman serve`
# (e2e/openapi/client.sh).
#
# Usage: e2e/run-tests.sh [extra cargo test arguments]
# PULLMAN_SKIP_CHART_TESTS=1 skips the chart tests; PULLMAN_TESTENV_REAL_NODE=0 starts no real
# node and skips what runs on it (a machine without root or containerd).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/stage.sh
. e2e/lib/stage.sh

export PULLMAN_TESTENV_STATE="${PULLMAN_TESTENV_STATE:-$(mktemp -d /tmp/pullman-testenv.XXXXXX)}"
# up.sh refuses a non-empty directory it did not create; a fresh mktemp dir is empty.
keda_build=""
tools_build=""
shp_build=""
cnpg_build=""
api_suites=""
cleanup() {
  # The background builds run in their own sessions (in_background): stop all of each, go build
  # included. A build already over makes `kill` fail, which under `set -e` ended this function
  # before down.sh and left the control plane running after a failed suite: hence `|| true`.
  [[ -n "$keda_build" ]] && { kill -- "-$keda_build" 2>/dev/null || true; }
  [[ -n "$tools_build" ]] && { kill -- "-$tools_build" 2>/dev/null || true; }
  [[ -n "$shp_build" ]] && { kill -- "-$shp_build" 2>/dev/null || true; }
  [[ -n "$cnpg_build" ]] && { kill -- "-$cnpg_build" 2>/dev/null || true; }
  [[ -n "$api_suites" ]] && { kill -- "-$api_suites" 2>/dev/null || true; }
  rm -f "${keda_log:-}" "${tools_log:-}" "${shp_log:-}" "${cnpg_log:-}" "${api_log:-}"
  e2e/testenv/down.sh >/dev/null 2>&1 || true
}
trap cleanup EXIT
# await_build WHAT VAR LOG: waits for the background build whose pid VAR names (await_background),
# then empties VAR: cleanup has nothing of it to stop.
await_build() {
  await_background "$1" "${!2}" "$3"
  printf -v "$2" '%s' ""
}
# api_suites_now: schemathesis against a real `pullman serve` (e2e/schemathesis/run.sh), then a
# client generated from its OpenAPI document, type-checked with mypy --strict and run
# (e2e/openapi/client.sh). Neither needs the control plane. A fixed seed keeps schemathesis'
# verdict repeatable; PULLMAN_ST_SEED=random explores new cases (run.sh alone always does).
# (Explicit returns: in the background job's shell, `set -e` is not on.)
api_suites_now() {
  if [[ "${PULLMAN_ST_SEED:-}" == random ]]; then
    e2e/schemathesis/run.sh || return 1
  else
    e2e/schemathesis/run.sh --seed "${PULLMAN_ST_SEED:-222431574333907669075365369244338807851}" || return 1
  fi
  e2e/openapi/client.sh || return 1
}
export -f api_suites_now
# on_pullman SUITE [ARGS...]: runs SUITE on the pullman binary cargo test built (target/debug/pullman).
on_pullman() { PULLMAN_BIN="$PWD/target/debug/pullman" "$@"; }

# The KEDA operator and adapter (e2e/keda: ~300 MB of modules, a long cold build) builds in the background,
# at a lower priority, overlapping everything up to its test at the end.
keda_log="$(mktemp /tmp/pullman-keda-build.XXXXXX)"
stage "building the KEDA operator and adapter in the background (cached after the first time; log: $keda_log)"
in_background 10 "$keda_log" e2e/keda/build.sh
keda_build=$bg_pid

# Tekton's and Shipwright's controllers, build-pod helpers and kaniko (e2e/shipwright: ~4.5 min cold) the
# same way, for the real node's build scenario.
if [[ "${PULLMAN_TESTENV_REAL_NODE:-1}" == 1 ]]; then
  shp_log="$(mktemp /tmp/pullman-shipwright-build.XXXXXX)"
  stage "building Tekton and Shipwright in the background (cached after the first time; log: $shp_log)"
  in_background 10 "$shp_log" e2e/shipwright/build.sh
  shp_build=$bg_pid
  # CloudNativePG's manager (e2e/cnpg: ~2 min cold), for the failover scenario.
  cnpg_log="$(mktemp /tmp/pullman-cnpg-build.XXXXXX)"
  stage "building CloudNativePG in the background (cached after the first time; log: $cnpg_log)"
  in_background 10 "$cnpg_log" e2e/cnpg/build.sh
  cnpg_build=$bg_pid
fi

stage "building the test control plane (cached after the first time)"
e2e/testenv/build.sh >/dev/null
# The chart tests' tools are needed only after cargo test: they build in the background too. Not
# before the control plane is built: their build takes the control plane's build lock (for helm),
# and a low-priority holder would keep the foreground waiting.
if [[ "${PULLMAN_SKIP_CHART_TESTS:-0}" != 1 ]]; then
  tools_log="$(mktemp /tmp/pullman-chart-tools.XXXXXX)"
  stage "building the chart tests' tools in the background: helm, actionlint, promrules, kube-score (cached after the first time; log: $tools_log)"
  in_background 5 "$tools_log" e2e/chart/tools.sh
  tools_build=$bg_pid
fi
stage "building the health helper (kstatus and Argo CD Lua verdicts; cached)"
PULLMAN_HEALTH_TOOL="$(e2e/testenv/tools/health/build.sh | tail -n1)"
export PULLMAN_HEALTH_TOOL
stage "starting the test control plane in $PULLMAN_TESTENV_STATE"
eval "$(e2e/testenv/up.sh)"
echo "    KUBECONFIG=$KUBECONFIG"

stage "cargo test (all targets, Kubernetes tests included)"
cargo test --locked --all-targets --features k8s-tests "$@"
# .ci/run builds the throughput guard in the background from here on (nothing below runs cargo).
if [[ -n "${PULLMAN_CARGO_TEST_DONE:-}" ]]; then touch "$PULLMAN_CARGO_TEST_DONE"; fi

if [[ "${PULLMAN_SKIP_CHART_TESTS:-0}" != 1 ]]; then
  stage "Helm chart tests (e2e/chart/test.sh; waiting for their tools' build)"
  await_build "the chart tests' tools" tools_build "$tools_log"
  on_pullman e2e/chart/test.sh
fi

if [[ "${PULLMAN_TESTENV_REAL_NODE:-1}" == 1 ]]; then
  stage "Pullman in real pods on the real node: the shared scenario (e2e/realnode/test.sh)"
  on_pullman e2e/realnode/test.sh
  # schemathesis runs for a fixed time (ST_MAX_TIME) and the disruptions mostly wait on a stopped
  # kubelet and containerd, so the two run side by side (about 200 s saved); the API suites'
  # output is printed after the disruptions' (below).
  api_log="$(mktemp /tmp/pullman-api-suites.XXXXXX)"
  in_background 0 "$api_log" bash -c api_suites_now
  api_suites=$bg_pid
  stage "disruptions under running orders: a node that stops reporting, a drain (e2e/realnode/disruptions.sh, docs/design.md §12)"
  on_pullman e2e/realnode/disruptions.sh
  stage "schemathesis against the served OpenAPI, then a Python client generated from it: their output (they ran beside the disruptions)"
  api_rc=0
  wait "$api_suites" || api_rc=$?
  api_suites=""
  cat "$api_log"
  rm -f "$api_log"
  (( api_rc == 0 )) || { echo "schemathesis or the generated Python client failed (output above)" >&2; exit 1; }
  stage "build orders with real Tekton and Shipwright on the real node (e2e/shipwright/test.sh; waiting for their build)"
  await_build "Tekton and Shipwright" shp_build "$shp_log"
  on_pullman e2e/shipwright/test.sh
  stage "PostgreSQL failovers under load: CloudNativePG on the real node, the fault suite through them (e2e/cnpg/test.sh; waiting for its build)"
  await_build "CloudNativePG" cnpg_build "$cnpg_log"
  on_pullman e2e/cnpg/test.sh
fi

stage "KEDA scales an Executor on its backlog (e2e/keda/test.sh; waiting for its build)"
await_build "KEDA's operator and adapter" keda_build "$keda_log"
on_pullman e2e/keda/test.sh

if [[ "${PULLMAN_TESTENV_REAL_NODE:-1}" != 1 ]]; then
  stage "schemathesis against the served OpenAPI, then a Python client generated from it (uses target/debug/pullman)"
  api_suites_now
fi

stage "stopping the test control plane: nothing of it, its real node included, may be left behind"
trap - EXIT
e2e/testenv/down.sh
stage_end
