#!/usr/bin/env bash
# Tests of the Helm chart (charts/pullman) on the test control plane (e2e/testenv: a real
# kube-apiserver with RBAC and Pod Security admission, kwok playing the kubelet):
#   1. static: CRD copy identical to crds/, helm lint --strict, the schema refusing typos and wrong
#      types, value combinations refused with a message, PrometheusRule expressions parsed
#      (promrules), workflows checked (actionlint);
#   2. every documented mode rendered and accepted by the API server (--dry-run=server);
#   3. helm install --wait into namespaces enforcing the `restricted` Pod Security Standard,
#      cluster-wide and namespaced; helm test; helm upgrade keeping the admin and agent tokens;
#   4. RBAC for real: `pullman serve` and `pullman executor` run on this machine with the tokens of
#      the chart's ServiceAccounts and take the pi Job WorkOrder to Succeeded and an Executor with
#      `deployment` to Ready; any 403 in their logs fails the test; the agent-only mode likewise;
#   5. uninstall as the chart README documents it.
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
cmp -s crds/pullman.dev.yaml "$CHART/files/crds/pullman.dev.yaml" \
  || fail "$CHART/files/crds/pullman.dev.yaml differs from crds/pullman.dev.yaml: cp crds/pullman.dev.yaml $CHART/files/crds/"
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
must_fail "ServiceMonitor and PodMonitor together" "not both" helm template t "$CHART" $DB \
  --set monitoring.serviceMonitor.enabled=true --set monitoring.podMonitor.enabled=true
must_fail "agent mode without a server URL" "agent.serverUrl" helm template t "$CHART" --set mode=agent
must_fail "an executor without rules" "executors\[demo\]" helm template t "$CHART" $DB --set 'executors[0].name=demo'
must_fail "an executor outside watchNamespaces" "not in watchNamespaces" helm template t "$CHART" $DB \
  --set 'watchNamespaces={team-a}' --set 'executors[0].name=demo' --set 'executors[0].rules[0].verbs={get}'
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
# The CRDs may already exist (applied with kubectl by earlier tests, as by a user moving from
# `kubectl apply -f crds/`): apply them, then mark them for adoption by the release that owns them.
k apply --server-side --force-conflicts -f crds/pullman.dev.yaml >/dev/null
k wait --for=condition=Established crd/workorders.pullman.dev crd/executors.pullman.dev --timeout=60s >/dev/null
for crd in workorders.pullman.dev executors.pullman.dev; do
  k label --overwrite crd "$crd" app.kubernetes.io/managed-by=Helm >/dev/null
  k annotate --overwrite crd "$crd" meta.helm.sh/release-name=pullman-cw meta.helm.sh/release-namespace=pullman-cw >/dev/null
done
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
executors:
  - name: demo
    namespace: team-cw
    labels: [demo]
    workTypes: [custom]
    maxConcurrency: 4
    leaseSeconds: 60
    rules:
      - {apiGroups: [batch], resources: [jobs], verbs: [get, list, watch, create, patch, delete, deletecollection]}
YAML
cat > "$WORK/ns.yaml" <<'YAML'
database: {existingSecret: pullman-app}
crds: {enabled: false}
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
  helm template "$rel" "$CHART" -n "$ns" --api-versions pullman.dev/v1alpha1/Executor "$@" > "$WORK/$rel.rendered.yaml"
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
dry_run "monitoring on" pullman-mon pullman-mon -f "$WORK/monitoring.yaml" --set crds.enabled=false
# The same check can fail: a pod template weakened by values is reported by the API server.
helm template weak "$CHART" -n pullman-mon -f "$WORK/monitoring.yaml" --set crds.enabled=false \
  --set server.securityContext.allowPrivilegeEscalation=true --show-only templates/deployment.yaml \
  | k apply --dry-run=server -f - > "$WORK/weak.log" 2>&1
grep -q 'would violate PodSecurity "restricted' "$WORK/weak.log" \
  || fail "a pod template allowing privilege escalation was not reported as violating restricted"
ok "a weakened pod template is reported as violating restricted (the check above can fail)"
# Executors are rendered only when their kind is served (first install: see the chart README).
n_without="$(helm template pullman-cw "$CHART" -n pullman-cw -f "$WORK/cw.yaml" | grep -c '^kind: Executor$' || true)"
[[ "$n_without" == 0 && "$(grep -c '^kind: Executor$' "$WORK/pullman-cw.rendered.yaml")" == 1 ]] \
  || fail "Executors rendered without their kind being served (or not rendered with it)"
ok "Executors rendered only when pullman.dev/v1alpha1/Executor is served"
grep -q "kind: ClusterRole$" "$WORK/pullman-ns.rendered.yaml" && fail "namespaced mode renders a ClusterRole"
grep -q -- "--watch-namespace=team-ns,pullman-ns" "$WORK/pullman-ns.rendered.yaml" || fail "namespaced mode does not pass --watch-namespace"
ok "namespaced mode: Roles only, --watch-namespace passed"

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

executor_ready() { # executor_ready <namespace> <name>
  k -n "$1" wait "executor/$2" --for=condition=Ready --timeout=90s >/dev/null \
    || { k -n "$1" get executor "$2" -o yaml | tail -n 30; fail "$1/$2: Executor not Ready"; }
  k -n "$1" get deploy "$2-executor" >/dev/null || fail "$1/$2: no executor Deployment"
  ok "$1/$2: Executor Ready, its Deployment available"
}

# ---------------------------------------------------------------------------------------------
step "cluster-wide: helm install --wait into a restricted namespace"
t=$SECONDS
helm install pullman-cw "$CHART" -n pullman-cw -f "$WORK/cw.yaml" --wait --timeout 3m > "$WORK/install-cw.log" \
  || fail "helm install pullman-cw"
ok "helm install --wait (cluster-wide) in $((SECONDS - t))s"
[[ "$(k -n pullman-cw get pods -l app.kubernetes.io/component=server -o jsonpath='{.items[*].status.phase}')" == "Running Running" ]] \
  || fail "the server pods were not admitted and running under enforce=restricted"
ok "2 server pods admitted under pod-security enforce=restricted"
helm test pullman-cw -n pullman-cw --timeout 2m > "$WORK/test-cw.log" || { cat "$WORK/test-cw.log"; fail "helm test"; }
ok "helm test"

step "cluster-wide: RBAC for real"
start_serve pullman-cw pullman-cw
executor_ready team-cw demo
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
k get crd workorders.pullman.dev executors.pullman.dev >/dev/null || fail "uninstall removed the CRDs (crds.keep)"
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
step "Helm 4: lint, install --wait (server-side apply, kstatus wait), test, upgrade, uninstall"
H4="$BIN/helm4"
"$H4" version --short
# shellcheck disable=SC2086
"$H4" lint --strict "$CHART" $DB >"$WORK/lint4.log" 2>&1 || { cat "$WORK/lint4.log"; fail "helm 4 lint --strict"; }
must_fail "helm 4 install with a typo" "replica" "$H4" install typo "$CHART" $DB --set server.replica=3 -n default --dry-run=server
restricted_ns pullman-h4
# shellcheck disable=SC2086
"$H4" install pullman-h4 "$CHART" -n pullman-h4 $DB --set crds.enabled=false --set 'watchNamespaces={pullman-h4}' \
  --wait --timeout 3m > "$WORK/install-h4.log" || fail "helm 4 install"
"$H4" test pullman-h4 -n pullman-h4 --timeout 2m > /dev/null || fail "helm 4 test"
admin_before="$(k -n pullman-h4 get secret pullman-h4-admin-token -o jsonpath='{.data.token}')"
# shellcheck disable=SC2086
"$H4" upgrade pullman-h4 "$CHART" -n pullman-h4 $DB --set crds.enabled=false --set 'watchNamespaces={pullman-h4}' \
  --set server.replicas=1 --wait --timeout 3m > /dev/null || fail "helm 4 upgrade"
[[ "$(k -n pullman-h4 get secret pullman-h4-admin-token -o jsonpath='{.data.token}')" == "$admin_before" ]] \
  || fail "helm 4 upgrade changed the admin token"
"$H4" uninstall pullman-h4 -n pullman-h4 --wait --timeout 2m > /dev/null || fail "helm 4 uninstall"
k delete namespace pullman-h4 --wait --timeout=60s >/dev/null || fail "namespace pullman-h4 stuck Terminating"
ok "helm 4: lint, install --wait, test, upgrade (admin token kept), uninstall"

echo "==> chart tests took $((SECONDS - T0))s"
echo "chart: $PASSED passed, $FAILED failed"
