#!/usr/bin/env bash
# The price of synchronous replication (issue #41): the queue's claim+complete ceiling (scenario 1
# of bench/queue.rs, `--quick sql`: 16 connections, 10,000 orders) on CloudNativePG's Cluster of
# three instances with `dataDurability: required` (charts/pullman/README.md's, as e2e/cnpg runs
# it) against a Cluster of one instance, both on the test control plane's real node with the same
# image and settings, alternating ROUNDS times (default 2) in one run. Prints one line per run and
# the ratio of the medians; the bench binary reaches each Cluster's `-rw` Service from this machine
# as its superuser (the bench creates a database per scenario).
#
#   eval "$(PULLMAN_TESTENV_REAL_NODE=1 e2e/testenv/up.sh)"; bench/cnpg.sh; e2e/testenv/down.sh
#
# Needs what e2e/cnpg/test.sh needs, and the release bench (cargo bench --bench queue --no-run).
set -euo pipefail
cd "$(dirname "$0")/.."
SUITE=cnpg-bench
# shellcheck source=../e2e/lib/check.sh
. e2e/lib/check.sh
# shellcheck source=../e2e/cnpg/platform.sh
. e2e/cnpg/platform.sh
: "${KUBECONFIG:?KUBECONFIG must point at the test control plane (e2e/testenv/up.sh)}"
export PULLMAN_TESTENV_STATE="${PULLMAN_TESTENV_STATE:-/tmp/pullman-testenv}"
ROUNDS="${ROUNDS:-2}"
BENCH="$(find target/release/deps -maxdepth 1 -type f -executable -name 'queue-*' -printf '%T@ %p\n' 2>/dev/null | sort -n | tail -n 1 | cut -d' ' -f2)"
[[ -x "$BENCH" ]] || fail "no release bench binary (cargo bench --bench queue --no-run)"
WORK="$(mktemp -d /tmp/pullman-cnpg-bench.XXXXXX)"
trap 'set +e; k delete cluster -n "$CNPG_NS" single --ignore-not-found --timeout=60s >/dev/null; cnpg_down; rm -rf "$WORK"' EXIT

cnpg_up "$WORK"
step "superuser access on the three-instance Cluster, and a Cluster of one instance beside it"
k patch cluster -n "$CNPG_NS" "$CNPG_CLUSTER" --type merge -p '{"spec":{"enableSuperuserAccess":true}}' >/dev/null
python3 - "$WORK/cluster.yaml" > "$WORK/single.yaml" <<'PY'
import sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
c["metadata"]["name"] = "single"
c["spec"]["instances"] = 1
c["spec"].get("postgresql", {}).pop("synchronous", None)
c["spec"]["enableSuperuserAccess"] = True
print(yaml.safe_dump(c))
PY
k apply -n "$CNPG_NS" -f "$WORK/single.yaml" >/dev/null || fail "applying the one-instance Cluster"
single_ready() { [[ "$(k get cluster -n "$CNPG_NS" single -o jsonpath='{.status.readyInstances}')" == 1 ]]; }
until_true 180 "the one-instance Cluster ready" single_ready
has_secret() { k get secret -n "$CNPG_NS" "$1-superuser" >/dev/null 2>&1; }
until_true 60 "the superuser Secrets" has_secret "$CNPG_CLUSTER"
until_true 60 "the superuser Secrets" has_secret single
url() { # url CLUSTER: its superuser's URL, on its -rw Service's address
  local ip uri
  ip="$(k get service -n "$CNPG_NS" "$1-rw" -o jsonpath='{.spec.clusterIP}')"
  uri="$(k get secret -n "$CNPG_NS" "$1-superuser" -o jsonpath='{.data.uri}' | base64 -d)"
  sed -E "s#@[^:/]+:5432/#@$ip:5432/#; s#/[^/]*\$#/postgres#" <<<"$uri"
}
ok "both ready"

step "scenario 1 (--quick sql), alternating, $ROUNDS rounds"
declare -A rates
for (( r = 1; r <= ROUNDS; r++ )); do
  for c in single "$CNPG_CLUSTER"; do
    line="$(PULLMAN_TEST_DATABASE_URL="$(url "$c")" "$BENCH" --bench --quick sql 2>&1 | grep '^| 1\. SQL ceiling')" \
      || fail "the bench on $c"
    rate="$(sed -E 's/.*\| ([0-9]+) orders\/s .*/\1/' <<<"$line")"
    rates[$c]+="$rate "
    echo "    round $r, $c: $rate orders/s"
  done
done
python3 - "${rates[single]}" "${rates[$CNPG_CLUSTER]}" <<'PY'
import statistics, sys
one, three = ([float(x) for x in a.split()] for a in sys.argv[1:3])
m1, m3 = statistics.median(one), statistics.median(three)
print(f"    one instance: median {m1:.0f} orders/s; three, synchronous: median {m3:.0f} orders/s; ratio {m3 / m1:.2f}")
print(f"    per core of this machine: {m1 / 2:.0f} and {m3 / 2:.0f} orders/s")
PY
finish
