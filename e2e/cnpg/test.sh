#!/usr/bin/env bash
# Pullman through PostgreSQL failovers (issue #41): CloudNativePG on the real node (platform.sh),
# a Cluster of 3 instances with synchronous replication, and the fault suite (e2e/faults) against
# it: two `pullman serve` replicas on this machine, the Cluster's `-rw` Service as their
# DATABASE_URL (the `uri` of its `<cluster>-app` Secret, its host name replaced by the Service's
# address, which this machine reaches through kube-proxy but cannot resolve), AGENTS agents
# (default 50) claiming and completing ORDERS orders (default 10,000), while the primary's pod is
# deleted and then a switchover promotes a replica (failover.sh, the suite's failover hook).
# Checked by the suite, from the database and what the agents recorded: no order lost or
# completed twice, no acknowledged complete lost, every accepted complete with the logged
# claim_id, no 5xx but 503, concurrency keys never over their max. The write outage of each
# failover and the first claim after the new primary is ready are printed (and appended to
# PULLMAN_FIGURES if set): figures, not pass marks (bench/README.md).
#
# Needs KUBECONFIG and PULLMAN_TESTENV_STATE of a test control plane with its real node
# (PULLMAN_TESTENV_REAL_NODE=1), Go, openssl, and the fault suite's binary (FAULTS_BIN, default the
# newest target/debug/deps/faults-*, built by `cargo test --test faults --no-run`: not run through
# cargo, which .ci/run is busy with in the background by then).
# Leaves nothing behind: the operator stopped, the Cluster, volumes, namespace and CRDs deleted.
set -euo pipefail
cd "$(dirname "$0")/../.."
SUITE=cnpg
# shellcheck source=../lib/check.sh
. e2e/lib/check.sh
# shellcheck source=platform.sh
. e2e/cnpg/platform.sh
: "${KUBECONFIG:?KUBECONFIG must point at the test control plane (e2e/testenv/up.sh)}"
export PULLMAN_TESTENV_STATE="${PULLMAN_TESTENV_STATE:-/tmp/pullman-testenv}"
AGENTS="${AGENTS:-50}" ORDERS="${ORDERS:-10000}"
FAULTS="${FAULTS_BIN:-$(find target/debug/deps -maxdepth 1 -type f -executable -name 'faults-*' -printf '%T@ %p\n' 2>/dev/null | sort -n | tail -n 1 | cut -d' ' -f2)}"
[[ -x "$FAULTS" ]] || fail "no fault suite binary (cargo test --test faults --no-run, or FAULTS_BIN)"

WORK="$(mktemp -d /tmp/pullman-cnpg.XXXXXX)"
diagnose() {
  echo "--- Cluster, pods"; k get cluster,pods -n "$CNPG_NS" -o wide || true
  echo "--- operator log (last 15 lines)"; tail -n 15 "$WORK/operator.log" 2>/dev/null | cut -c1-400 || true
}
cleanup() {
  set +e
  cnpg_down
  rm -rf "$WORK"
}
trap cleanup EXIT

cnpg_up "$WORK"
sync="$(k exec -n "$CNPG_NS" "$(cnpg_primary)" -c postgres -- psql -U postgres -Atc 'SHOW synchronous_standby_names')"
[[ "$sync" == "ANY 1 ("* ]] || fail "synchronous_standby_names is '$sync', not ANY 1 (…)"
ok "synchronous replication: $sync"

step "the fault suite: $AGENTS agents, $ORDERS orders, the primary's pod deleted, then a switchover"
rw="$(k get service -n "$CNPG_NS" "$CNPG_CLUSTER-rw" -o jsonpath='{.spec.clusterIP}')"
uri="$(k get secret -n "$CNPG_NS" "$CNPG_CLUSTER-app" -o jsonpath='{.data.uri}' | base64 -d)"
[[ "$uri" == *"@$CNPG_CLUSTER-rw.$CNPG_NS:5432/"* ]] || fail "the app Secret's uri is not on $CNPG_CLUSTER-rw.$CNPG_NS:5432"
url="${uri/@$CNPG_CLUSTER-rw.$CNPG_NS:5432\//@$rw:5432/}"
export CNPG_NS CNPG_CLUSTER
if ! "$FAULTS" --database-url="$url" --failover-hook="$PWD/e2e/cnpg/failover.sh" \
  --agents="$AGENTS" --orders="$ORDERS" > "$WORK/faults.log" 2>&1; then
  sed -n '/^## Fault suite/,$p' "$WORK/faults.log" | head -80
  tail -n 5 "$WORK/faults.log"
  fail "the fault suite failed through the failovers (above)"
fi
grep -A6 '^| # | fault' "$WORK/faults.log"
grep -q '^PASS$' "$WORK/faults.log" || fail "the fault suite did not say PASS"
ok "nothing lost, nothing completed twice, no 5xx but 503, through both failovers"

# The figures: per failover, the longest stretch without a complete (the write outage as the
# agents saw it) and the first claim after the new primary was ready.
figures="$(python3 - "$WORK/faults.log" <<'PY'
import sys
rows = [l.split("|")[1:-1] for l in open(sys.argv[1]) if l.startswith("| ") and "failover:" in l]
for r in rows:
    c = [x.strip() for x in r]
    print(f"{c[1]}: new primary ready {c[2]}, longest without a complete {c[6]}, first claim after ready {c[7]}")
PY
)"
echo "$figures"
[[ "$(wc -l <<<"$figures")" == 2 ]] || fail "the fault suite's table has no two failover rows"
if [[ -n "${PULLMAN_FIGURES:-}" ]]; then
  sed 's/^/cnpg: /' <<<"$figures" >> "$PULLMAN_FIGURES"
fi
finish
