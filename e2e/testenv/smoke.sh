#!/usr/bin/env bash
# Smoke test for a running testenv (start it with up.sh first). Exits non-zero
# if any check fails.
#   1. /version reports the stamped Kubernetes version
#   2. the "pi" Job from the Kubernetes docs reaches Complete within 30s
#   3. a Job annotated pullman.dev/kwok-fail reaches Failed within 30s,
#      with the requested container exit code
#   4. a CRD with a status subresource registers and serves (incl. /status)
#   5. kubectl apply --server-side works
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/versions.sh"
STATE="${PULLMAN_TESTENV_STATE:-/tmp/pullman-testenv}"
export KUBECONFIG="${KUBECONFIG:-$STATE/kubeconfig}"
[[ -f "$KUBECONFIG" ]] || { echo "smoke.sh: no kubeconfig at $KUBECONFIG; run up.sh first" >&2; exit 2; }

NS="smoke-$(date +%s)-$RANDOM"
FAILED=0
pass() { echo "PASS  $*"; }
fail() { echo "FAIL  $*"; FAILED=1; }
now() { date +%s.%N; }
secs() { awk -v a="$(now)" -v b="$1" 'BEGIN { printf "%.1f", a - b }'; }
k() { kubectl --request-timeout=15s "$@"; }

k create namespace "$NS" >/dev/null || { echo "cannot create namespace $NS"; exit 1; }
trap 'k delete namespace "$NS" --wait=false >/dev/null 2>&1; k delete crd widgets.smoke.pullman.dev --wait=false >/dev/null 2>&1' EXIT

# 1. version ---------------------------------------------------------------------
ver="$(k get --raw /version | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p')"
if [[ "$ver" == "$K8S_VERSION" ]]; then pass "/version gitVersion=$ver"; else fail "/version gitVersion='$ver', want $K8S_VERSION"; fi

# 2. pi Job completes ------------------------------------------------------------
t=$(now)
k apply -n "$NS" -f - >/dev/null <<'EOF'
apiVersion: batch/v1
kind: Job
metadata:
  name: pi
spec:
  template:
    spec:
      containers:
      - name: pi
        image: perl:5.34.0
        command: ["perl", "-Mbignum=bpi", "-wle", "print bpi(2000)"]
      restartPolicy: Never
  backoffLimit: 4
EOF
if k wait -n "$NS" --for=condition=Complete job/pi --timeout=30s >/dev/null; then
  pass "job/pi Complete after $(secs "$t")s"
else
  fail "job/pi not Complete within 30s: $(k get -n "$NS" job/pi -o jsonpath='{.status}')"
fi

# 3. failing Job fails -----------------------------------------------------------
t=$(now)
k apply -n "$NS" -f - >/dev/null <<'EOF'
apiVersion: batch/v1
kind: Job
metadata:
  name: fail
spec:
  backoffLimit: 0
  template:
    metadata:
      annotations:
        pullman.dev/kwok-fail: "true"
        pullman.dev/kwok-exit-code: "3"
    spec:
      containers:
      - name: main
        image: busybox
        command: ["sh", "-c", "exit 3"]
      restartPolicy: Never
EOF
if k wait -n "$NS" --for=condition=Failed job/fail --timeout=30s >/dev/null; then
  code="$(k get pods -n "$NS" -l job-name=fail -o jsonpath='{.items[0].status.containerStatuses[0].state.terminated.exitCode}')"
  phase="$(k get pods -n "$NS" -l job-name=fail -o jsonpath='{.items[0].status.phase}')"
  if [[ "$code" == 3 && "$phase" == Failed ]]; then
    pass "job/fail Failed after $(secs "$t")s (pod phase=$phase exitCode=$code)"
  else
    fail "job/fail Failed but pod phase='$phase' exitCode='$code' (want Failed/3)"
  fi
else
  fail "job/fail not Failed within 30s: $(k get -n "$NS" job/fail -o jsonpath='{.status}')"
fi

# 4. CRD with status subresource ---------------------------------------------------
t=$(now)
k apply -f - >/dev/null <<'EOF'
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.smoke.pullman.dev
spec:
  group: smoke.pullman.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
          status:
            type: object
            properties:
              phase: {type: string}
EOF
if k wait --for=condition=Established crd/widgets.smoke.pullman.dev --timeout=30s >/dev/null; then
  ok=0
  for _ in $(seq 1 50); do  # discovery may lag behind Established briefly
    if k apply -n "$NS" -f - >/dev/null 2>&1 <<'EOF'
apiVersion: smoke.pullman.dev/v1
kind: Widget
metadata:
  name: w1
spec:
  size: 3
status:
  phase: ignored-on-main-resource
EOF
    then ok=1; break; fi
    sleep 0.2
  done
  if [[ $ok == 1 ]] \
    && k patch -n "$NS" widget/w1 --subresource=status --type=merge -p '{"status":{"phase":"Ready"}}' >/dev/null \
    && [[ "$(k get -n "$NS" widget/w1 -o jsonpath='{.status.phase}/{.spec.size}')" == "Ready/3" ]]; then
    pass "CRD widgets.smoke.pullman.dev served, status subresource works ($(secs "$t")s)"
  else
    fail "CRD served but status subresource check failed: $(k get -n "$NS" widget/w1 -o json 2>&1 | head -c 600)"
  fi
else
  fail "CRD not Established within 30s"
fi

# 5. server-side apply -------------------------------------------------------------
cm() {
  k apply --server-side --field-manager=pullman-smoke -n "$NS" -f - <<EOF
apiVersion: v1
kind: ConfigMap
metadata:
  name: ssa
data:
  key: "$1"
EOF
}
if cm one >/dev/null && cm two >/dev/null \
  && [[ "$(k get -n "$NS" cm/ssa -o jsonpath='{.data.key}')" == two ]] \
  && k get -n "$NS" cm/ssa -o jsonpath='{.metadata.managedFields[*].manager}' | grep -qw pullman-smoke \
  && [[ "$(k get -n "$NS" cm/ssa -o jsonpath='{.metadata.managedFields[0].operation}')" == Apply ]]; then
  pass "kubectl apply --server-side (field manager pullman-smoke, operation Apply)"
else
  fail "server-side apply check failed"
fi

if [[ $FAILED == 0 ]]; then echo "smoke: all checks passed"; else echo "smoke: FAILED"; fi
exit $FAILED
