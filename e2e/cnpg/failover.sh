#!/usr/bin/env bash
# The failover hook of e2e/cnpg/test.sh, called by the fault suite (`--failover-hook`):
#   failover.sh delete       `kubectl delete pod` of the primary: CloudNativePG promotes a replica
#   failover.sh switchover   a switchover to a ready replica, as `kubectl cnpg promote` asks for
#                            one (the Cluster's status: targetPrimary and its timestamp)
# Returns once the new primary is ready: the Cluster's currentPrimary is another instance, its
# pod is Ready, its PostgreSQL is out of recovery, and the `-rw` Service leads to it (only its
# address in the Service's EndpointSlices). currentPrimary and Ready alone come seconds before
# the Service does. Prints what happened on stderr. Needs KUBECONFIG, CNPG_NS and CNPG_CLUSTER.
set -euo pipefail
: "${CNPG_NS:?}" "${CNPG_CLUSTER:?}"
k() { kubectl --request-timeout=20s -n "$CNPG_NS" "$@"; }
primary() { k get cluster "$CNPG_CLUSTER" -o jsonpath='{.status.currentPrimary}'; }
ready() { [[ "$(k get pod "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]; }
serves_writes() {
  local ip endpoints
  ready "$1" || return 1
  ip="$(k get pod "$1" -o jsonpath='{.status.podIP}')"
  endpoints="$(k get endpointslices -l "kubernetes.io/service-name=$CNPG_CLUSTER-rw" \
    -o jsonpath='{range .items[*].endpoints[*]}{.addresses[0]}{" "}{end}')"
  [[ -n "$ip" && "$endpoints" == "$ip " ]] || return 1
  [[ "$(k exec "$1" -c postgres -- psql -U postgres -Atc 'SELECT pg_is_in_recovery()' 2>/dev/null)" == f ]]
}
old="$(primary)"
[[ -n "$old" ]] || { echo "failover.sh: the Cluster names no current primary" >&2; exit 1; }
t0=$SECONDS
case "${1:-}" in
  delete)
    k delete pod "$old" --wait=false >/dev/null
    ;;
  switchover)
    target=""
    for pod in $(k get pods -l "cnpg.io/cluster=$CNPG_CLUSTER,cnpg.io/instanceRole=replica" -o name); do
      if ready "${pod#pod/}"; then target="${pod#pod/}"; break; fi
    done
    [[ -n "$target" ]] || { echo "failover.sh: no ready replica to switch over to" >&2; exit 1; }
    k patch cluster "$CNPG_CLUSTER" --subresource=status --type=merge -p "{\"status\":{
      \"targetPrimary\":\"$target\",\"targetPrimaryTimestamp\":\"$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)\",
      \"phase\":\"Switchover in progress\",\"phaseReason\":\"Switching over to $target\"}}" >/dev/null
    ;;
  *) echo "usage: failover.sh delete | switchover" >&2; exit 2 ;;
esac
while (( SECONDS - t0 < 120 )); do
  new="$(primary)" || new=""
  if [[ -n "$new" && "$new" != "$old" ]] && serves_writes "$new"; then
    echo "failover.sh: $1: primary $old -> $new, ready after $((SECONDS - t0)) s" >&2
    exit 0
  fi
  sleep 0.5
done
echo "failover.sh: $1: no new primary ready within 120 s (still $(primary))" >&2
exit 1
