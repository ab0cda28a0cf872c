# Helpers of the chart tests (sourced by e2e/chart/test.sh, which sets ROOT, WORK, PULLMAN, HELM
# and PIDS and sources e2e/lib/check.sh first): rendered rules, refusals, restricted namespaces,
# and `pullman serve` / `pullman executor` run here with the tokens of the chart's ServiceAccounts.

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
  # or a UUID ("61d883c1-7571-403a-…") it is no status code, and matching it there failed CI
  # twice.
  local f pattern='forbidden|(^|[^0-9a-fA-F.-])403([^0-9a-fA-F-]|$)'
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
