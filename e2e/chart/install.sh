# Sections 3 to 6 of e2e/chart/test.sh (sourced by it): helm install, RBAC for real, upgrade and
# uninstall, cluster-wide and namespaced, then Helm 4.

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
