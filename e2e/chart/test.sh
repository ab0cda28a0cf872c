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

PASSED=0
FAILED=0
T0=$SECONDS
step() { echo "==> [chart $((SECONDS - T0))s] $*"; }
ok() { PASSED=$((PASSED + 1)); echo "    ok: $*"; }
fail() {
  FAILED=$((FAILED + 1)); echo "    FAILED: $*" >&2
  echo "chart: $PASSED passed, $FAILED failed"
  exit 1
}
k() { kubectl --request-timeout=20s "$@"; }
helm() { "$HELM" "$@"; }
# JSON field of stdin: jsonf 'd["id"]' (Python expression over the parsed document d).
jsonf() { python3 -c 'import sys, json; d = json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"; }
# The spec of every PrometheusRule in a YAML stream, as a rule file.
rule_file() { python3 -c 'import sys, yaml
for d in yaml.safe_load_all(sys.stdin):
    if d and d.get("kind") == "PrometheusRule": print(yaml.safe_dump(d["spec"], sort_keys=False))'; }

# Runs a command that must fail, with stderr matching a pattern.
must_fail() { # must_fail <what> <pattern> <command...>
  local what="$1" pattern="$2" out; shift 2
  if out="$("$@" 2>&1)"; then fail "$what: succeeded, should have failed"; fi
  grep -qE -- "$pattern" <<<"$out" || fail "$what: error does not say /$pattern/: $out"
  ok "$what refused: $(grep -E -- "$pattern" <<<"$out" | head -n1 | cut -c1-160)"
}

restricted_ns() { # restricted_ns <name> [level]: a namespace whose pods must pass <level>
  k create namespace "$1" --dry-run=client -o yaml | k apply -f - >/dev/null
  k label --overwrite namespace "$1" "pod-security.kubernetes.io/enforce=${2:-restricted}" \
    pod-security.kubernetes.io/warn=restricted >/dev/null
}

# ---------------------------------------------------------------------------------------------
step "static checks"
cmp -s crds/pullman.dev.yaml "$CHART/crds/pullman.dev.yaml" \
  || fail "$CHART/crds/pullman.dev.yaml differs from crds/pullman.dev.yaml: cp crds/pullman.dev.yaml $CHART/crds/"
ok "chart CRDs byte-identical to crds/"
python3 e2e/chart/values-table.py "$CHART/values.yaml" > "$WORK/values-table.md" || fail "values.yaml: undocumented values"
sed -n '/^<!-- values-table:/,/^<!-- end values-table -->/p' "$CHART/README.md" | sed '1d;$d' > "$WORK/readme-table.md"
diff -u "$WORK/readme-table.md" "$WORK/values-table.md" \
  || fail "the values table in $CHART/README.md is stale: regenerate it with e2e/chart/values-table.py $CHART/values.yaml"
ok "every value documented in values.yaml and in the README's table"

DB="--set database.url=postgres://pullman:secret@db.example:5432/pullman"
cat > "$WORK/agent.yaml" <<'YAML'
mode: agent
agent:
  serverUrl: http://pullman.example:8080
  tokenSecret: {name: fleet-agent-token}
  rules:
    - {apiGroups: [batch], resources: [jobs], verbs: [get, list, watch, create, patch, delete, deletecollection]}
YAML
cat > "$WORK/monitoring.yaml" <<'YAML'
database: {existingSecret: pullman-app}
monitoring:
  serviceMonitor: {enabled: true, labels: {release: prometheus}}
  prometheusRule: {enabled: true}
  grafanaDashboard: {enabled: true}
YAML
# shellcheck disable=SC2086
helm lint --strict "$CHART" $DB >"$WORK/lint.log" 2>&1 || { cat "$WORK/lint.log"; fail "helm lint --strict (server)"; }
helm lint --strict "$CHART" -f "$WORK/agent.yaml" >"$WORK/lint.log" 2>&1 || { cat "$WORK/lint.log"; fail "helm lint --strict (agent)"; }
helm lint --strict "$CHART" -f "$WORK/monitoring.yaml" >"$WORK/lint.log" 2>&1 || { cat "$WORK/lint.log"; fail "helm lint --strict (monitoring)"; }
ok "helm lint --strict in server, agent and monitoring modes"

# shellcheck disable=SC2086
{
must_fail "a misspelt key (server.replica)" "replica" helm template t "$CHART" $DB --set server.replica=3
must_fail "a misspelt top-level key (watchNamespace)" "watchNamespace" helm template t "$CHART" $DB --set watchNamespace=a
must_fail "a wrong type (server.replicas=two)" "replicas" helm template t "$CHART" $DB --set server.replicas=two
must_fail "an unknown mode" "mode" helm template t "$CHART" $DB --set mode=everything
must_fail "a bad namespace name" "watchNamespaces" helm template t "$CHART" $DB --set 'watchNamespaces={Team_A}'
must_fail "no database" "database.existingSecret .* or database.url" helm template t "$CHART"
must_fail "a grace period the shutdown delay and drain do not fit in" "terminationGracePeriodSeconds \(15\) must exceed server.shutdownDelaySeconds \(5\) \+ 10" \
  helm template t "$CHART" $DB --set server.terminationGracePeriodSeconds=15
must_fail "ServiceMonitor and PodMonitor together" "not both" helm template t "$CHART" $DB \
  --set monitoring.serviceMonitor.enabled=true --set monitoring.podMonitor.enabled=true
must_fail "agent mode without a server URL" "agent.serverUrl" helm template t "$CHART" --set mode=agent
must_fail "an executor without rules" "executors\[demo\]" helm template t "$CHART" $DB --set 'executors[0].name=demo'
must_fail "an executor outside watchNamespaces" "not in watchNamespaces" helm template t "$CHART" $DB \
  --set 'watchNamespaces={team-a}' --set 'executors[0].name=demo' --set 'executors[0].rules[0].verbs={get}'
must_fail "an executor with replicas and keda.enabled" "set replicas or keda.enabled, not both" helm template t "$CHART" $DB \
  --set 'executors[0].name=demo' --set 'executors[0].rules[0].verbs={get}' --set 'executors[0].replicas=2' \
  --set 'executors[0].keda.enabled=true'
must_fail "a misspelt keda key (maxReplica)" "maxReplica" helm template t "$CHART" $DB \
  --set 'executors[0].name=demo' --set 'executors[0].rules[0].verbs={get}' --set 'executors[0].keda.maxReplica=3'
must_fail "the removed crds.enabled" "--skip-crds" helm template t "$CHART" $DB --set crds.enabled=false
must_fail "an unknown anti-affinity" "podAntiAffinity" helm template t "$CHART" $DB --set server.podAntiAffinity=sometimes
must_fail "a networkPolicy typo" "ingresFrom" helm template t "$CHART" $DB --set networkPolicy.ingresFrom=x
}
# A typo must stop `helm install` itself, before anything reaches the cluster.
must_fail "helm install with a typo" "replica" helm install typo "$CHART" $DB --set server.replica=3 -n default --dry-run=server

helm template t "$CHART" -n pullman-mon -f "$WORK/monitoring.yaml" --show-only templates/monitoring.yaml \
  | rule_file > "$WORK/rules.yaml"
"$BIN/promrules" "$WORK/rules.yaml" || fail "PrometheusRule expressions do not parse"
sed '0,/expr: /s/expr: /expr: sum(/' "$WORK/rules.yaml" > "$WORK/broken-rules.yaml"
if "$BIN/promrules" "$WORK/broken-rules.yaml" >/dev/null 2>&1; then fail "promrules accepted a broken expression"; fi
ok "PrometheusRule: every expression parses (and a broken one is refused)"
for m in pullman_queue_lag_seconds pullman_agents pullman_controller_reconcile_errors_total \
         pullman_reclaims_exhausted_total pullman_work_orders; do
  grep -q "$m" "$WORK/rules.yaml" || fail "no alert uses $m"
done
helm template t "$CHART" -f "$WORK/monitoring.yaml" --show-only templates/monitoring.yaml \
  | python3 -c 'import sys, yaml, json
cm = [d for d in yaml.safe_load_all(sys.stdin) if d and d["kind"] == "ConfigMap"][0]
assert len(json.loads(cm["data"]["pullman.json"])["panels"]) > 5' \
  || fail "dashboard ConfigMap does not hold the dashboard JSON"
ok "dashboard ConfigMap holds valid JSON"

if compgen -G ".github/workflows/*.yml" >/dev/null; then
  "$BIN/actionlint" -shellcheck= .github/workflows/*.yml || fail "actionlint"
  ok "actionlint .github/workflows"
fi

# ---------------------------------------------------------------------------------------------
step "every mode rendered and accepted by the API server (--dry-run=server)"
# kwok's nodes report no ephemeral-storage, which every kubelet does; without it the scheduler
# leaves pods that request some (the chart's, by default) Pending. Real nodes are left alone.
for node in $(k get nodes -o jsonpath='{range .items[?(@.metadata.annotations.kwok\.x-k8s\.io/node=="fake")]}{.metadata.name}{" "}{end}'); do
  [[ -n "$(k get node "$node" -o jsonpath='{.status.allocatable.ephemeral-storage}')" ]] && continue
  k patch node "$node" --subresource=status --type=merge \
    -p '{"status":{"capacity":{"ephemeral-storage":"100Gi"},"allocatable":{"ephemeral-storage":"100Gi"}}}' >/dev/null
done
# `helm template` leaves crds/ out, so the Executors in a dry run need the CRDs in the cluster
# (earlier tests may have applied them already). The installs below start without them.
k apply --server-side --force-conflicts -f "$CHART/crds/pullman.dev.yaml" >/dev/null
k wait --for=condition=Established crd/workorders.pullman.dev crd/executors.pullman.dev --timeout=60s >/dev/null
# Prometheus Operator and Grafana are not part of the test control plane: minimal CRDs for the
# monitoring kinds (schema-less), so the objects still go through the API server.
k apply -f e2e/chart/monitoring-crds.yaml >/dev/null
k wait --for=condition=Established -f e2e/chart/monitoring-crds.yaml --timeout=60s >/dev/null
for ns in pullman-cw team-cw pullman-ns team-ns pullman-agent pullman-mon; do
  restricted_ns "$ns"
done
# The teams' namespaces also run the work's own pods (the sample pi Job sets no restricted
# securityContext), so they enforce `baseline` and warn on `restricted`.
restricted_ns team-cw baseline
restricted_ns team-ns baseline

cat > "$WORK/cw.yaml" <<'YAML'
database: {url: "postgres://pullman:secret@db.example:5432/pullman"}
server: {replicas: 2}
networkPolicy: {enabled: true}
executors:
  - name: demo
    namespace: team-cw
    labels: [demo]
    workTypes: [custom]
    maxConcurrency: 4
    leaseSeconds: 60
    rules:
      - {apiGroups: [batch], resources: [jobs], verbs: [get, list, watch, create, patch, delete, deletecollection]}
  - name: reports
    namespace: team-cw
    labels: [reports]
    rules:
      - {apiGroups: [""], resources: [configmaps], verbs: [get, list, watch, create, patch, delete]}
YAML
cat > "$WORK/ns.yaml" <<'YAML'
database: {existingSecret: pullman-app}
watchNamespaces: [team-ns, pullman-ns]
server: {replicas: 1}
executors:
  - name: demo
    namespace: team-ns
    labels: [demo]
    rules:
      - {apiGroups: [batch], resources: [jobs], verbs: [get, list, watch, create, patch, delete, deletecollection]}
YAML
dry_run() { # dry_run <what> <release> <namespace> <helm template args...>
  local what="$1" rel="$2" ns="$3"; shift 3
  helm template "$rel" "$CHART" -n "$ns" "$@" > "$WORK/$rel.rendered.yaml"
  k apply --dry-run=server -f "$WORK/$rel.rendered.yaml" > "$WORK/$rel.dry-run.log" 2>&1 \
    || { cat "$WORK/$rel.dry-run.log"; fail "$what: the API server refused a rendered object"; }
  # The namespaces warn on `restricted`: the API server judges every pod template it is sent.
  if grep -q "would violate PodSecurity" "$WORK/$rel.dry-run.log"; then
    grep "would violate PodSecurity" "$WORK/$rel.dry-run.log" >&2
    fail "$what: a pod template does not pass the restricted Pod Security Standard"
  fi
  ok "$what: $(grep -c '(server dry run)' "$WORK/$rel.dry-run.log") objects accepted, pod templates pass restricted ($(grep '(server dry run)' "$WORK/$rel.dry-run.log" | cut -d' ' -f1 | cut -d/ -f1 | sort -u | tr '\n' ' '))"
}
dry_run "cluster-wide" pullman-cw pullman-cw -f "$WORK/cw.yaml"
dry_run "namespaced" pullman-ns pullman-ns -f "$WORK/ns.yaml"
dry_run "agent-only" pullman-agent pullman-agent -f "$WORK/agent.yaml"
dry_run "monitoring on" pullman-mon pullman-mon -f "$WORK/monitoring.yaml"
dry_run "namespaced, networkPolicy" pullman-ns-np pullman-ns -f "$WORK/ns.yaml" --set networkPolicy.enabled=true \
  --set 'networkPolicy.database.to[0].podSelector.matchLabels.cnpg\.io/cluster=pullman-db' \
  --set 'networkPolicy.apiServer.to[0].ipBlock.cidr=10.0.0.1/32'
dry_run "agent-only, networkPolicy" pullman-agent-np pullman-agent -f "$WORK/agent.yaml" --set networkPolicy.enabled=true
# The same check can fail: a pod template weakened by values is reported by the API server.
helm template weak "$CHART" -n pullman-mon -f "$WORK/monitoring.yaml" \
  --set server.securityContext.allowPrivilegeEscalation=true --show-only templates/deployment.yaml \
  | k apply --dry-run=server -f - > "$WORK/weak.log" 2>&1
grep -q 'would violate PodSecurity "restricted' "$WORK/weak.log" \
  || fail "a pod template allowing privilege escalation was not reported as violating restricted"
ok "a weakened pod template is reported as violating restricted (the check above can fail)"
# ... and so can the NetworkPolicy check: the API server judges the rules it is sent.
helm template weak "$CHART" -n pullman-mon -f "$WORK/monitoring.yaml" --set networkPolicy.enabled=true \
  --set 'networkPolicy.apiServer.to[0].ipBlock.cidr=10.0.0.1/99' --show-only templates/networkpolicy.yaml \
  | k apply --dry-run=server -f - > "$WORK/weak-np.log" 2>&1 && fail "the API server accepted a NetworkPolicy with a bad CIDR"
grep -q 'cidr' "$WORK/weak-np.log" || { cat "$WORK/weak-np.log"; fail "a bad NetworkPolicy was refused for another reason"; }
ok "a NetworkPolicy with a bad CIDR is refused by the API server (the dry runs above can fail)"
# Executors are rendered as they are, with no .Capabilities question: what `helm template`
# (Argo CD, Flux post-rendering, Tilt) renders is what `helm install` installs.
[[ "$(grep -c '^kind: Executor$' "$WORK/pullman-cw.rendered.yaml")" == 2 ]] \
  || fail "helm template did not render both Executors of cw.yaml"
ok "both Executors rendered by a plain helm template"
python3 - "$WORK" <<'PY' || fail "rendered NetworkPolicies, anti-affinity or resources are not what values.yaml says"
import sys, yaml
work = sys.argv[1]
def docs(rel):
    return [d for d in yaml.safe_load_all(open(f"{work}/{rel}.rendered.yaml")) if d]
def one(rel, kind, name=None):
    found = [d for d in docs(rel) if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (rel, kind, name, len(found))
    return found[0]
# cluster-wide: 2 replicas -> soft anti-affinity over the server pods; no CPU limit; ephemeral storage.
pod = one("pullman-cw", "Deployment")["spec"]["template"]["spec"]
term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
assert term["topologyKey"] == "kubernetes.io/hostname", term
assert term["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "server", term
res = pod["containers"][0]["resources"]
assert "cpu" not in res["limits"] and res["limits"]["ephemeral-storage"] == "256Mi" and res["requests"]["ephemeral-storage"] == "32Mi", res
# Its NetworkPolicy: ingress on the API port from the release namespace and team-cw (an executor's);
# egress to DNS, PostgreSQL and the API server only.
np = one("pullman-cw", "NetworkPolicy", "pullman-cw")["spec"]
assert np["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "server", np
assert np["policyTypes"] == ["Ingress", "Egress"], np
[ing] = np["ingress"]
assert ing["ports"] == [{"port": "http", "protocol": "TCP"}], ing
assert ing["from"] == [{"podSelector": {}}, {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "team-cw"}}}], ing
ports = [[p["port"] for p in r["ports"]] for r in np["egress"]]
assert ports == [[53, 53], [5432], [443, 6443]], ports
assert all("to" not in r for r in np["egress"]), np["egress"]
# namespaced, narrowed: 1 replica -> no anti-affinity; the given peers are used as they are.
pod = one("pullman-ns", "Deployment")["spec"]["template"]["spec"]
assert "affinity" not in pod, pod.get("affinity")
egress = one("pullman-ns-np", "NetworkPolicy", "pullman-ns-np")["spec"]["egress"]
assert egress[1]["to"] == [{"podSelector": {"matchLabels": {"cnpg.io/cluster": "pullman-db"}}}], egress
assert egress[2]["to"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}], egress
# agent: no ingress at all; egress to the central server's port (http://pullman.example:8080).
np = one("pullman-agent-np", "NetworkPolicy", "pullman-agent-np-agent")["spec"]
assert np["ingress"] == [] and np["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "agent", np
assert [[p["port"] for p in r["ports"]] for r in np["egress"]] == [[53, 53], [8080], [443, 6443]], np["egress"]
assert [d["metadata"]["name"] for d in docs("pullman-agent-np") if d["kind"] == "NetworkPolicy"] == ["pullman-agent-np-agent"]
# The `helm test` pod's own policy: out only to DNS and the server pods' API port.
np = one("pullman-cw", "NetworkPolicy", "pullman-cw-test")["spec"]
job = one("pullman-cw", "Job")["spec"]["template"]["metadata"]["labels"]
assert np["podSelector"]["matchLabels"] == job and np["ingress"] == [], (np, job)
assert np["egress"][1] == {"ports": [{"port": "http", "protocol": "TCP"}], "to": [{"podSelector": {"matchLabels": {
    "app.kubernetes.io/name": "pullman", "app.kubernetes.io/instance": "pullman-cw", "app.kubernetes.io/component": "server"}}}]}, np
PY
ok "rendered: soft anti-affinity only with 2+ replicas, no CPU limit, ephemeral storage, NetworkPolicy rules"
# The overrides: hard, none, a CPU limit, and an anti-affinity of one's own winning.
# shellcheck disable=SC2086
render_pod() { helm template t "$CHART" $DB --show-only templates/deployment.yaml "$@" \
  | python3 -c 'import sys, yaml, json; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d and d["kind"] == "Deployment"][0]["spec"]["template"]["spec"]))'; }
render_pod --set server.podAntiAffinity=hard | jsonf 'd["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"]' | grep -qx kubernetes.io/hostname \
  || fail "podAntiAffinity=hard does not render a required term"
[[ "$(render_pod --set server.podAntiAffinity=none | jsonf '"affinity" in d')" == False ]] || fail "podAntiAffinity=none still renders an affinity"
[[ "$(render_pod --set 'server.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight=7' \
  --set 'server.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.topologyKey=zone' \
  | jsonf 'd["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"]')" == 7 ]] \
  || fail "server.affinity.podAntiAffinity does not replace the default"
[[ "$(render_pod --set server.resources.limits.cpu=500m | jsonf 'd["containers"][0]["resources"]["limits"]["cpu"]')" == 500m ]] \
  || fail "server.resources.limits.cpu is not rendered"
ok "overrides: podAntiAffinity hard/none, server.affinity's own podAntiAffinity, a CPU limit"
grep -q "kind: ClusterRole$" "$WORK/pullman-ns.rendered.yaml" && fail "namespaced mode renders a ClusterRole"
grep -q -- "--watch-namespace=team-ns,pullman-ns" "$WORK/pullman-ns.rendered.yaml" || fail "namespaced mode does not pass --watch-namespace"
ok "namespaced mode: Roles only, --watch-namespace passed"

step "kube-score on every documented mode (each finding fixed or listed in the chart README)"
kube_score() { # kube_score <release>: kube-score's JSON for what the dry runs above sent
  "$BIN/kube-score" score -o json --kubernetes-version v1.27 "$WORK/$1.rendered.yaml" > "$WORK/$1.kube-score.json" || true
  python3 -c 'import json, sys; assert json.load(open(sys.argv[1]))' "$WORK/$1.kube-score.json" \
    || fail "kube-score produced no report for $1"
}
for rel in pullman-cw pullman-ns pullman-agent pullman-mon; do kube_score "$rel"; done
python3 e2e/chart/kube-score.py "$CHART/README.md" cluster-wide="$WORK/pullman-cw.kube-score.json" pullman-cw \
  namespaced="$WORK/pullman-ns.kube-score.json" pullman-ns agent-only="$WORK/pullman-agent.kube-score.json" pullman-agent \
  monitoring="$WORK/pullman-mon.kube-score.json" pullman-mon > "$WORK/kube-score.log" \
  || { cat "$WORK/kube-score.log"; fail "kube-score: findings differ from the chart README's table"; }
ok "$(tail -n1 "$WORK/kube-score.log")"
# The comparison can fail: without the anti-affinity, 2 replicas are a finding the README lacks.
helm template pullman-cw "$CHART" -n pullman-cw -f "$WORK/cw.yaml" --set server.podAntiAffinity=none > "$WORK/pullman-cw-noaa.rendered.yaml"
kube_score pullman-cw-noaa
if python3 e2e/chart/kube-score.py "$CHART/README.md" cluster-wide="$WORK/pullman-cw-noaa.kube-score.json" pullman-cw \
  > "$WORK/kube-score-noaa.log" 2>&1; then fail "kube-score: a chart without anti-affinity passed the comparison"; fi
grep -q "deployment-has-host-podantiaffinity" "$WORK/kube-score-noaa.log" \
  || { cat "$WORK/kube-score-noaa.log"; fail "kube-score: the missing anti-affinity was not the finding reported"; }
ok "kube-score: a chart without the anti-affinity fails the comparison (deployment-has-host-podantiaffinity)"

# ---------------------------------------------------------------------------------------------
# Runs `pullman serve` locally as the chart's server ServiceAccount would run it.
sa_kubeconfig() { # sa_kubeconfig <namespace> <serviceaccount> <file>
  local server ca token
  server="$(k config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')"
  ca="$(k config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')"
  token="$(k -n "$1" create token "$2" --duration=2h)"
  cat > "$3" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: testenv, cluster: {server: "$server", certificate-authority-data: "$ca"}}]
users: [{name: sa, user: {token: "$token"}}]
contexts: [{name: sa, context: {cluster: testenv, user: sa, namespace: $1}}]
current-context: sa
EOF
  chmod 600 "$3"
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start_serve() { # start_serve <release> <namespace>: sets SERVE_PID, API
  local rel="$1" ns="$2" port args=() a
  port="$(free_port)"
  API="http://127.0.0.1:$port"
  sa_kubeconfig "$ns" "$rel" "$WORK/$rel.kubeconfig"
  # The container's arguments, as the chart rendered them into the Deployment.
  mapfile -t args < <(k -n "$ns" get deploy "$rel" -o jsonpath='{range .spec.template.spec.containers[0].args[*]}{@}{"\n"}{end}')
  local run=()
  for a in "${args[@]}"; do
    case "$a" in --listen=*) ;; *) run+=("$a") ;; esac
  done
  run+=("--listen=127.0.0.1:$port" "--data-dir=$WORK/$rel-data")
  ADMIN_TOKEN="$(k -n "$ns" get secret "$rel-admin-token" -o jsonpath='{.data.token}' | base64 -d)"
  echo "    serve ${run[*]}"
  env -u DATABASE_URL KUBECONFIG="$WORK/$rel.kubeconfig" HOSTNAME="$rel-local" \
    PULLMAN_ADMIN_TOKEN="$ADMIN_TOKEN" RUST_LOG=info,kube_client=info \
    "$PULLMAN" "${run[@]}" > "$WORK/$rel.serve.log" 2>&1 &
  SERVE_PID=$!
  PIDS+=("$SERVE_PID")
  local i
  for i in $(seq 1 120); do
    curl -fsS "$API/readyz" >/dev/null 2>&1 && break
    kill -0 "$SERVE_PID" 2>/dev/null || { tail -n 30 "$WORK/$rel.serve.log"; fail "$rel: pullman serve exited"; }
    sleep 0.5
  done
  curl -fsS "$API/readyz" >/dev/null || { tail -n 30 "$WORK/$rel.serve.log"; fail "$rel: /readyz never answered"; }
  ok "$rel: pullman serve ready with the chart's ServiceAccount token and arguments"
}

start_executor() { # start_executor <log name> <kube namespace> <serviceaccount> <agent token file> <target ns>
  sa_kubeconfig "$2" "$3" "$WORK/$1.kubeconfig"
  KUBECONFIG="$WORK/$1.kubeconfig" RUST_LOG=info,kube_client=info \
    "$PULLMAN" executor --server "$API" --token-file "$4" --target-namespace "$5" --lease-seconds 30 \
    > "$WORK/$1.executor.log" 2>&1 &
  PIDS+=("$!")
  EXECUTOR_PID=$!
}

no_forbidden() { # no_forbidden <log files...>
  # Any 403 fails, except the API server refusing new objects in a namespace being deleted (left
  # over by earlier tests on the same control plane), which is not a question of rights. 403 is
  # matched as a number of its own: inside a longer one (a timestamp's microseconds, ".574039Z")
  # it is no status code, and matching it there failed CI once.
  local f pattern='forbidden|(^|[^0-9.])403([^0-9]|$)'
  for f in "$@"; do
    if grep -Ei "$pattern" "$f" | grep -v 'because it is being terminated' >/dev/null; then
      grep -Ei "$pattern" "$f" | grep -v 'because it is being terminated' | head -n 5 >&2
      fail "$(basename "$f"): a call was forbidden (RBAC too narrow)"
    fi
  done
  ok "no call forbidden ($(for f in "$@"; do basename "$f"; done | tr '\n' ' '))"
}

pi_to_succeeded() { # pi_to_succeeded <namespace>
  k -n "$1" apply -f config/samples/workorder-pi-job.yaml >/dev/null
  k -n "$1" wait workorder/pi --for=jsonpath='{.status.phase}'=Succeeded --timeout=120s >/dev/null \
    || { k -n "$1" get workorder pi -o yaml | tail -n 30; fail "$1: pi WorkOrder did not reach Succeeded"; }
  ok "$1: pi WorkOrder Succeeded ($(k -n "$1" get workorder pi -o jsonpath='{.status.message}'))"
}

# A cluster without Pullman's CRDs, as before a first install. Custom resources left by earlier
# tests (kept Executors) lose their finalizers first: no controller runs to remove them, and a
# CRD is not deleted while any of its objects is.
remove_crds() {
  local kind
  for kind in workorders.pullman.dev executors.pullman.dev; do
    k get crd "$kind" >/dev/null 2>&1 || continue
    k get "$kind" -A -o jsonpath='{range .items[*]}{.metadata.namespace} {.metadata.name}{"\n"}{end}' \
      | while read -r ns name; do
          [[ -n "$name" ]] && k -n "$ns" patch "$kind" "$name" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null
        done
  done
  k delete crd workorders.pullman.dev executors.pullman.dev --ignore-not-found --wait --timeout=60s >/dev/null \
    || fail "the CRDs could not be removed before a first install"
  ! k get crd executors.pullman.dev >/dev/null 2>&1 || fail "executors.pullman.dev still exists"
}

executor_ready() { # executor_ready <namespace> <name>
  k -n "$1" wait "executor/$2" --for=condition=Ready --timeout=90s >/dev/null \
    || { k -n "$1" get executor "$2" -o yaml | tail -n 30; fail "$1/$2: Executor not Ready"; }
  k -n "$1" get deploy "$2-executor" >/dev/null || fail "$1/$2: no executor Deployment"
  ok "$1/$2: Executor Ready, its Deployment available"
}

# ---------------------------------------------------------------------------------------------
step "cluster-wide: a first helm install --wait, on a cluster without the CRDs, into a restricted namespace"
remove_crds
# Without the CRDs the Executors cannot be created: Helm refuses the release before creating
# anything, and says what to do (it never leaves them out silently).
must_fail "helm install --skip-crds without the CRDs" "ensure CRDs are installed first" \
  helm install pullman-cw "$CHART" -n pullman-cw -f "$WORK/cw.yaml" --skip-crds
# The server needs them too (its controller watches both kinds): `--controller=on`, as the chart
# runs it, refuses to start without them and says what to do (before: it ran, reconciling nothing).
must_fail "pullman serve --controller=on without the CRDs" "not served by the Kubernetes API; install the CRDs" \
  timeout -s KILL 120 env -u DATABASE_URL PULLMAN_ADMIN_TOKEN=unused "$PULLMAN" serve --controller=on \
  --listen=127.0.0.1:0 --data-dir="$WORK/no-crds-data" --leader-election-namespace=default
helm status pullman-cw -n pullman-cw >/dev/null 2>&1 && fail "the refused install left a release"
[[ -z "$(k -n pullman-cw get deploy,sa -l app.kubernetes.io/instance=pullman-cw -o name)" ]] \
  || fail "the refused install left objects behind"
ok "the refused install left no release and no objects"
t=$SECONDS
helm install pullman-cw "$CHART" -n pullman-cw -f "$WORK/cw.yaml" --wait --timeout 3m > "$WORK/install-cw.log" \
  || fail "helm install pullman-cw"
ok "helm install --wait (cluster-wide) in $((SECONDS - t))s"
# Right after the first install, before any controller ran: the CRDs from crds/ and both Executors.
k get crd workorders.pullman.dev executors.pullman.dev >/dev/null || fail "the first install did not create the CRDs"
[[ "$(k get executors -A -l app.kubernetes.io/instance=pullman-cw -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name} {end}')" == "team-cw/demo team-cw/reports " ]] \
  || fail "the first install did not create both Executors"
grep -q "NetworkPolicy" <(helm get manifest pullman-cw -n pullman-cw) || fail "the release has no NetworkPolicy"
ok "the first install created the CRDs, both Executors and the NetworkPolicy"
[[ "$(k -n pullman-cw get pods -l app.kubernetes.io/component=server -o jsonpath='{.items[*].status.phase}')" == "Running Running" ]] \
  || fail "the server pods were not admitted and running under enforce=restricted"
ok "2 server pods admitted under pod-security enforce=restricted"
helm test pullman-cw -n pullman-cw --timeout 2m > "$WORK/test-cw.log" || { cat "$WORK/test-cw.log"; fail "helm test"; }
ok "helm test"

step "cluster-wide: RBAC for real"
start_serve pullman-cw pullman-cw
executor_ready team-cw demo
executor_ready team-cw reports
k -n team-cw get secret demo-agent-token -o jsonpath='{.data.token}' | base64 -d > "$WORK/cw-agent.token"
start_executor cw-demo team-cw demo-executor "$WORK/cw-agent.token" team-cw
pi_to_succeeded team-cw

# Agent-only mode, pointed at this server: a second agent registered through the admin API.
"$PULLMAN" agents create --server "$API" --token "$ADMIN_TOKEN" --name fleet-a --label fleet \
  --token-out "$WORK/fleet.token" >/dev/null
k -n pullman-agent create secret generic fleet-agent-token --from-file=token="$WORK/fleet.token" >/dev/null
helm install pullman-agent "$CHART" -n pullman-agent -f "$WORK/agent.yaml" --set agent.serverUrl="$API" \
  --wait --timeout 2m > "$WORK/install-agent.log" || fail "helm install pullman-agent"
ok "agent-only: helm install --wait under enforce=restricted"
start_executor fleet pullman-agent pullman-agent "$WORK/fleet.token" pullman-agent
cat > "$WORK/fleet-job.yaml" <<'YAML'
apiVersion: batch/v1
kind: Job
metadata: {name: fleet-pi}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      # The agent's namespace enforces `restricted`: without this its pod would be refused.
      securityContext: {runAsNonRoot: true, runAsUser: 1000, seccompProfile: {type: RuntimeDefault}}
      containers:
        - name: pi
          image: perl:5.34.0
          command: [perl, -e, "print 3.14"]
          securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
YAML
order="$("$PULLMAN" work-orders create --server "$API" --token "$ADMIN_TOKEN" -f "$WORK/fleet-job.yaml" --label fleet -o json | jsonf 'd["id"]')"
for i in $(seq 1 60); do
  outcome="$(curl -fsS -H "Authorization: Bearer $ADMIN_TOKEN" "$API/api/v1/work-order-log/$order" 2>/dev/null | jsonf 'd["outcome"]' 2>/dev/null || true)"
  [[ -n "$outcome" && "$outcome" != null ]] && break
  sleep 1
done
[[ "$outcome" == succeeded ]] || { tail -n 20 "$WORK/fleet.executor.log"; fail "agent-only: the fleet order ended '$outcome'"; }
ok "agent-only: pullman executor with the agent ServiceAccount ran a Job order to succeeded"

curl -fsS "$API/metrics" > "$WORK/metrics.txt"
for m in pullman_queue_lag_seconds 'pullman_agents{health="active"}' \
         'pullman_controller_reconciles_total{controller="workorder"}' \
         'pullman_controller_reconciles_total{controller="executor"}' \
         'pullman_controller_reconcile_errors_total{controller="workorder",error="kube"}' \
         pullman_controller_reconcile_duration_seconds_bucket; do
  grep -qF "$m" "$WORK/metrics.txt" || fail "/metrics has no $m"
done
ok "/metrics has the queue lag, agents by health and the controller's reconcile metrics"
no_forbidden "$WORK/pullman-cw.serve.log" "$WORK/cw-demo.executor.log" "$WORK/fleet.executor.log"

step "cluster-wide: helm upgrade keeps the admin and agent tokens"
admin_before="$(k -n pullman-cw get secret pullman-cw-admin-token -o jsonpath='{.data.token}')"
agent_before="$(k -n team-cw get secret demo-agent-token -o jsonpath='{.data.token}')"
helm upgrade pullman-cw "$CHART" -n pullman-cw -f "$WORK/cw.yaml" --set server.replicas=3 --wait --timeout 3m \
  > "$WORK/upgrade-cw.log" || fail "helm upgrade"
sleep 2
[[ "$(k -n pullman-cw get secret pullman-cw-admin-token -o jsonpath='{.data.token}')" == "$admin_before" ]] \
  || fail "helm upgrade changed the admin token"
[[ "$(k -n team-cw get secret demo-agent-token -o jsonpath='{.data.token}')" == "$agent_before" ]] \
  || fail "helm upgrade changed the agent token"
[[ "$(k -n pullman-cw get deploy pullman-cw -o jsonpath='{.status.readyReplicas}')" == 3 ]] || fail "upgrade: not 3 replicas"
ok "helm upgrade: 3 replicas, admin token and agent token unchanged"

step "cluster-wide: helm uninstall with the controller gone"
stop_pids "$SERVE_PID" "$EXECUTOR_PID"
helm uninstall pullman-agent -n pullman-agent --wait --timeout 2m >/dev/null || fail "helm uninstall pullman-agent"
helm uninstall pullman-cw -n pullman-cw --wait --timeout 2m >/dev/null || fail "helm uninstall pullman-cw"
k get crd workorders.pullman.dev executors.pullman.dev >/dev/null || fail "uninstall removed the CRDs (Helm keeps crds/)"
[[ -z "$(k -n team-cw get executor demo -o jsonpath='{.metadata.deletionTimestamp}')" ]] \
  || fail "uninstall deleted the Executor while its controller is gone"
ok "uninstall kept the CRDs and the Executor (nothing left waiting on a finalizer)"
k delete namespace pullman-cw pullman-agent --wait --timeout=60s >/dev/null || fail "release namespaces stuck Terminating"
ok "release namespaces deleted, none stuck Terminating"

# ---------------------------------------------------------------------------------------------
step "namespaced: Roles only, helm install --wait into a restricted namespace"
k -n pullman-ns create secret generic pullman-app --from-literal=uri=postgres://app:secret@cnpg-rw:5432/app \
  --dry-run=client -o yaml | k apply -f - >/dev/null
helm install pullman-ns "$CHART" -n pullman-ns -f "$WORK/ns.yaml" --wait --timeout 3m > "$WORK/install-ns.log" \
  || fail "helm install pullman-ns"
ok "helm install --wait (namespaced)"
helm test pullman-ns -n pullman-ns --timeout 2m >/dev/null || fail "helm test (namespaced)"
ok "helm test (namespaced)"
sa=system:serviceaccount:pullman-ns:pullman-ns
[[ "$(k auth can-i list workorders.pullman.dev --all-namespaces --as "$sa" || true)" == no ]] \
  || fail "namespaced mode grants cluster-wide rights"
[[ "$(k auth can-i list secrets -n default --as "$sa" || true)" == no ]] || fail "namespaced mode reaches other namespaces"
[[ "$(k auth can-i create leases -n pullman-ns --as "$sa" || true)" == no ]] || fail "the Lease Role is not scoped"
ok "namespaced: no cluster-wide rights, no other namespace, Lease rights on one name only"

step "namespaced: RBAC for real"
start_serve pullman-ns pullman-ns
executor_ready team-ns demo
k -n team-ns get secret demo-agent-token -o jsonpath='{.data.token}' | base64 -d > "$WORK/ns-agent.token"
start_executor ns-demo team-ns demo-executor "$WORK/ns-agent.token" team-ns
pi_to_succeeded team-ns
no_forbidden "$WORK/pullman-ns.serve.log" "$WORK/ns-demo.executor.log"

step "namespaced: the documented full removal leaves nothing Terminating"
k -n team-ns delete workorders,executors --all --wait --timeout=60s >/dev/null \
  || fail "deleting WorkOrders and Executors while the controller runs"
stop_pids "$SERVE_PID" "$EXECUTOR_PID"
helm uninstall pullman-ns -n pullman-ns --wait --timeout 2m >/dev/null || fail "helm uninstall pullman-ns"
k delete namespace team-ns pullman-ns --wait --timeout=60s >/dev/null || fail "namespaces stuck Terminating"
ok "WorkOrders/Executors deleted first, then uninstall: namespaces deleted"

# ---------------------------------------------------------------------------------------------
step "Helm 4: lint, a first install with executors (server-side apply, kstatus wait), test, upgrade, uninstall"
H4="$BIN/helm4"
"$H4" version --short
# shellcheck disable=SC2086
"$H4" lint --strict "$CHART" $DB >"$WORK/lint4.log" 2>&1 || { cat "$WORK/lint4.log"; fail "helm 4 lint --strict"; }
must_fail "helm 4 install with a typo" "replica" "$H4" install typo "$CHART" $DB --set server.replica=3 -n default --dry-run=server
restricted_ns pullman-h4
restricted_ns team-h4 baseline
cat > "$WORK/h4.yaml" <<'YAML'
database: {url: "postgres://pullman:secret@db.example:5432/pullman"}
watchNamespaces: [pullman-h4, team-h4]
server: {replicas: 2}
executors:
  - name: build
    labels: [build]
    rules:
      - {apiGroups: [batch], resources: [jobs], verbs: [get, list, watch, create, patch, delete, deletecollection]}
  - name: demo
    namespace: team-h4
    labels: [demo]
    rules:
      - {apiGroups: [batch], resources: [jobs], verbs: [get, list, watch, create, patch, delete, deletecollection]}
YAML
remove_crds
must_fail "helm 4 install --skip-crds without the CRDs" "ensure CRDs are installed first" \
  "$H4" install pullman-h4 "$CHART" -n pullman-h4 -f "$WORK/h4.yaml" --skip-crds
"$H4" install pullman-h4 "$CHART" -n pullman-h4 -f "$WORK/h4.yaml" --wait --timeout 3m > "$WORK/install-h4.log" \
  || fail "helm 4 install"
[[ "$(k get executors -A -l app.kubernetes.io/instance=pullman-h4 -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name} {end}')" == "pullman-h4/build team-h4/demo " ]] \
  || fail "the first helm 4 install did not create both Executors"
ok "helm 4: the first install created the CRDs and both Executors"
"$H4" test pullman-h4 -n pullman-h4 --timeout 2m > /dev/null || fail "helm 4 test"
start_serve pullman-h4 pullman-h4
executor_ready pullman-h4 build
executor_ready team-h4 demo
no_forbidden "$WORK/pullman-h4.serve.log"
admin_before="$(k -n pullman-h4 get secret pullman-h4-admin-token -o jsonpath='{.data.token}')"
agent_before="$(k -n team-h4 get secret demo-agent-token -o jsonpath='{.data.token}')"
"$H4" upgrade pullman-h4 "$CHART" -n pullman-h4 -f "$WORK/h4.yaml" --set server.replicas=1 --wait --timeout 3m > /dev/null \
  || fail "helm 4 upgrade"
[[ "$(k -n pullman-h4 get secret pullman-h4-admin-token -o jsonpath='{.data.token}')" == "$admin_before" ]] \
  || fail "helm 4 upgrade changed the admin token"
[[ "$(k -n team-h4 get secret demo-agent-token -o jsonpath='{.data.token}')" == "$agent_before" ]] \
  || fail "helm 4 upgrade changed the agent token"
ok "helm 4 upgrade: admin and agent tokens unchanged"
# The documented full removal: custom resources while the controller runs, then the release.
k delete executors -n pullman-h4 --all --wait --timeout=60s >/dev/null || fail "deleting the helm 4 Executors"
k delete executors -n team-h4 --all --wait --timeout=60s >/dev/null || fail "deleting the helm 4 Executors"
stop_pids "$SERVE_PID"
"$H4" uninstall pullman-h4 -n pullman-h4 --wait --timeout 2m > /dev/null || fail "helm 4 uninstall"
k delete namespace pullman-h4 team-h4 --wait --timeout=60s >/dev/null || fail "helm 4 namespaces stuck Terminating"
ok "helm 4: lint, first install with Executors Ready, test, upgrade (tokens kept), uninstall"

echo "==> chart tests took $((SECONDS - T0))s"
echo "chart: $PASSED passed, $FAILED failed"
