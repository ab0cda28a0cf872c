# Sections 1 and 2 of e2e/chart/test.sh (sourced by it): static checks, every documented mode
# rendered and accepted by the API server, kube-score.

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
# Both executors read Nodes (docs/design.md §12), through one ClusterRole that grants nothing else.
python3 - "$WORK" <<'PY' || fail "the executors' Node reading is not one read-only ClusterRole bound to both"
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(f"{sys.argv[1]}/pullman-cw.rendered.yaml")) if d]
role = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-executor-nodes")]
assert len(role) == 1 and role[0]["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}], role
binding = [d for d in docs if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == role[0]["metadata"]["name"]]
execs = sorted((d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"].endswith("-executor"))
assert len(binding) == 1 and sorted((s["namespace"], s["name"]) for s in binding[0]["subjects"]) == execs and len(execs) == 2, (binding, execs)
PY
ok "the executors read Nodes through one read-only ClusterRole bound to each of them"
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
