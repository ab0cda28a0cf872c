#!/usr/bin/env bash
# The test control plane's real node: containerd + runc (Debian packages), the CNI bridge and
# host-local plugins (Debian's containernetworking-plugins), a kubelet and kube-proxy built from
# the same k8s.io/kubernetes module as the API server, and CoreDNS as the cluster DNS. Pods on it
# run real containers; kwok nodes stay beside it for scale tests.
#
#   node.sh up     called by up.sh once the API server answers (needs STATE, BIN, KC exported)
#   node.sh down   called by down.sh after the controllers stopped, before the API server stops
#   node.sh check  one line per missing prerequisite; exit 1 if any is missing
#
# Placement is explicit: the node is labelled and tainted `pullman.dev/node=real` (NoSchedule), so
# only pods that ask for it (nodeSelector + toleration) land here; kwok nodes carry
# `pullman.dev/node=kwok` and no taint. Pods reach each other and this machine only (no
# masquerading): the API server and PostgreSQL through the bridge address 10.88.0.1.
#
# Networks: pods 10.88.0.0/16 on bridge `pullman0` (gateway 10.88.0.1, also the node's IP and the
# API server's advertised address; forwarding only from the bridge back into it); Services
# 10.0.0.0/24; cluster DNS 10.0.0.10 (Service kube-system/kube-dns, endpoints CoreDNS on the
# gateway). One real node per machine: the bridge and kube-proxy's iptables chains are
# machine-wide.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="${STATE:-${PULLMAN_TESTENV_STATE:-/tmp/pullman-testenv}}"
N="$STATE/node"
NODE_NAME="${PULLMAN_TESTENV_REAL_NODE_NAME:-real-node-0}"
BRIDGE=pullman0
NODE_GATEWAY=10.88.0.1
POD_CIDR=10.88.0.0/16
DNS_IP=10.0.0.10
SOCK="$N/containerd.sock"

log() { echo "node.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
ctr_() { ctr --address "$SOCK" --namespace k8s.io "$@"; }

# --- prerequisites -------------------------------------------------------------------------------
check() {
  local missing=0 b
  [[ "$(id -u)" == 0 ]] || { echo "the real node needs root (kubelet, containerd, bridges, iptables)"; missing=1; }
  for b in containerd containerd-shim-runc-v2 runc ctr iptables ip6tables conntrack ip ss mount busybox; do
    command -v "$b" >/dev/null || { echo "missing $b (apt install containerd runc iptables conntrack iproute2 busybox-static)"; missing=1; }
  done
  for b in bridge host-local loopback portmap; do
    [[ -x "/usr/lib/cni/$b" ]] || { echo "missing CNI plugin /usr/lib/cni/$b (apt install containernetworking-plugins)"; missing=1; }
  done
  # A module on Debian's stock kernel, built in on some: load it if it can be.
  [[ -d /proc/sys/net/bridge ]] || modprobe br_netfilter 2>/dev/null || true
  [[ -d /proc/sys/net/bridge ]] || { echo "br_netfilter is not loaded (modprobe br_netfilter; apt install kmod): Services would not route between pods"; missing=1; }
  # A run killed before its down.sh (every process of it SIGKILLed) leaves the bridge, veths,
  # mounts and iptables chains: with no kubelet or containerd of any real node running, they are
  # removed here rather than blocking this machine's next control plane for good.
  if [[ "$missing" == 0 ]] && ip link show "$BRIDGE" >/dev/null 2>&1 && ! node_processes_run; then
    remove_dead_node >&2 || { echo "bridge $BRIDGE is left by a real node whose processes are gone, and removing what it left failed (above)"; missing=1; }
  fi
  if [[ "$missing" == 0 ]] && ip link show "$BRIDGE" >/dev/null 2>&1; then
    echo "bridge $BRIDGE exists: another test control plane's real node runs on this machine (stop it with its down.sh, or start this one with PULLMAN_TESTENV_REAL_NODE=0)"
    missing=1
  fi
  return $missing
}

# Whether the kubelet or containerd of a real node (of any state dir) runs on this machine.
node_processes_run() {
  pgrep -f -- '--root-dir=[^ ]*/node/kubelet' >/dev/null || pgrep -f -- '^containerd --config [^ ]*/node/containerd.toml' >/dev/null
}

# The state dir of the real node that made the bridge: its alias, set at `up`; for a bridge made
# before the alias was, the directory its containers' mounts are under (empty when unknown).
bridge_owner() {
  local owner
  owner="$(ip -o link show "$BRIDGE" 2>/dev/null | sed -n 's/.*alias pullman-testenv:\(.*\)$/\1/p')"
  [[ -n "$owner" ]] || owner="$(awk '$2 ~ /\/node\/containerd\// { sub(/\/node\/containerd\/.*/, "", $2); print $2; exit }' /proc/mounts)"
  echo "$owner"
}

# `down` for a real node whose processes are gone: its state dir when known (its mounts go too),
# else an empty one (the machine-wide rest: veths, network namespaces, bridge, iptables chains).
remove_dead_node() {
  local owner scratch="" rc=0
  owner="$(bridge_owner)"
  if [[ -z "$owner" || ! -d "$owner/node" ]]; then
    scratch="$(mktemp -d)"; mkdir "$scratch/node"; owner="$scratch"
  fi
  log "bridge $BRIDGE is left by a real node whose kubelet and containerd are gone (${scratch:+owner unknown}${scratch:-$owner}): removing what it left"
  STATE="$owner" "$HERE/node.sh" down || rc=$?
  [[ -z "$scratch" ]] || rm -rf "$scratch"
  return $rc
}

start() { # start <name> <binary> <args...>: detached, in its own session, pid recorded like up.sh's
  local name="$1" bin="$2"; shift 2
  setsid "$bin" "$@" >"$STATE/logs/$name.log" 2>&1 </dev/null &
  echo $! > "$STATE/pids/$name.pid"
}
alive() { local p; p="$(cat "$STATE/pids/$1.pid" 2>/dev/null)" && kill -0 "$p" 2>/dev/null; }
wait_until() { # wait_until <seconds> <what> <component> <command...>: one line naming what failed
  local secs="$1" what="$2" comp="$3" end; shift 3
  end=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    alive "$comp" || { tail -n 15 "$STATE/logs/$comp.log" >&2; die "$comp exited while waiting for $what (log: $STATE/logs/$comp.log)"; }
    (( $(date +%s) < end )) || { tail -n 15 "$STATE/logs/$comp.log" >&2; die "$what: not within ${secs}s (log: $STATE/logs/$comp.log)"; }
    sleep 0.3
  done
}
USED_PORTS=" "
free_port() { # as up.sh: a random unused port, never one handed out before; sets PORT
  local p
  while :; do
    p=$(( 20000 + (RANDOM * 32768 + RANDOM) % 30000 ))
    [[ "$USED_PORTS" == *" $p "* ]] && continue
    [[ -z "$(ss -Hltun "sport = :$p" 2>/dev/null)" ]] || continue
    USED_PORTS+="$p "; PORT=$p; return
  done
}

up() {
  : "${BIN:?}" "${KC:?}"
  local msg
  if ! msg="$(check)"; then die "the real node cannot start: ${msg//$'\n'/; }"; fi
  for b in kubelet kube-proxy coredns; do [[ -x "$BIN/$b" ]] || die "missing $BIN/$b (e2e/testenv/build.sh builds it)"; done
  mkdir -p "$N"/{cni,cni-ipam,kubelet,pod-logs,containerd/root,containerd/state,images}
  local t0=$SECONDS k="kubectl --kubeconfig $KC --request-timeout=10s"

  # The bridge exists before anything needs its address: the kubelet's node IP, the API server's
  # advertised address (up.sh), CoreDNS and the tests' PostgreSQL listen on it. The CNI bridge
  # plugin takes it over as it is.
  ip link add "$BRIDGE" type bridge
  # Names this state dir, for a later `check` that finds the bridge with nothing running.
  ip link set "$BRIDGE" alias "pullman-testenv:$STATE"
  ip addr add "$NODE_GATEWAY/16" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables
  # A pod reaching another pod through a Service is routed back out of the bridge after the DNAT:
  # forwarding is turned on for what arrives on the bridge only (this machine's ip_forward stays
  # as it is), and nothing from a pod is forwarded anywhere but back to the bridge.
  echo 1 > "/proc/sys/net/ipv4/conf/$BRIDGE/forwarding"
  iptables -I FORWARD -i "$BRIDGE" ! -o "$BRIDGE" -m comment --comment pullman-testenv -j DROP

  cat > "$N/cni/10-pullman.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "pullman",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$N/cni-ipam",
              "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_GATEWAY"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  # restrict_oom_score_adj: this machine lacks CAP_SYS_RESOURCE, and the CRI's -998 for sandboxes
  # makes every runc create fail ("can't get final child's PID from pipe") without it.
  cat > "$N/containerd.toml" <<EOF
version = 2
root = "$N/containerd/root"
state = "$N/containerd/state"
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:dev"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$N/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
EOF
  start containerd containerd --config "$N/containerd.toml"
  wait_until 30 "containerd answering on $SOCK" containerd ctr_ version
  log "containerd up ($(( SECONDS - t0 ))s)"

  # The pause and busybox images; the Pullman image is imported by images.sh once built.
  "$HERE/images.sh" base >&2 || die "importing the pause and busybox images failed"

  local kubelet_port healthz_port proxy_healthz proxy_metrics dns_port dns_health dns_ready
  free_port; kubelet_port=$PORT; free_port; healthz_port=$PORT; free_port; proxy_healthz=$PORT
  free_port; proxy_metrics=$PORT; free_port; dns_port=$PORT; free_port; dns_health=$PORT
  free_port; dns_ready=$PORT
  # Pods reach this machine through the bridge: not the kubelet (anonymous, AlwaysAllow: exec in
  # any pod) and not the API server's port but through Service `kubernetes`... which is the
  # bridge address too, so only the kubelet's port is closed to them. The API server listens on
  # every interface for the bridge's sake: its port is closed to all but loopback and the bridge.
  iptables -I INPUT -i "$BRIDGE" -p tcp --dport "$kubelet_port" -m comment --comment pullman-testenv -j DROP
  local api_port
  api_port="$(awk -F= '$1 == "API_PORT" { print $2 }' "$STATE/ports")"
  if [[ -n "$api_port" ]]; then
    iptables -I INPUT -p tcp --dport "$api_port" -m comment --comment pullman-testenv -j DROP
    iptables -I INPUT -i lo -p tcp --dport "$api_port" -m comment --comment pullman-testenv -j ACCEPT
    iptables -I INPUT -i "$BRIDGE" -p tcp --dport "$api_port" -m comment --comment pullman-testenv -j ACCEPT
  fi
  cat >> "$STATE/ports" <<EOF
KUBELET_PORT=$kubelet_port
DNS_PORT=$dns_port
EOF

  # Image garbage collection off: the imported images cannot be pulled again. Eviction on disk
  # signals off too ("0%" turns a threshold off): this node shares the machine's disk with the
  # Rust build, and evicting the chart's pods when that disk runs low turned a full disk into
  # dozens of Evicted replicas and a timeout (stop 44's CI). A full disk still fails, by name.
  cat > "$N/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_GATEWAY
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $healthz_port
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://$SOCK
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failCgroupV1: false
failSwapOn: false
clusterDNS: [$DNS_IP]
clusterDomain: cluster.local
podLogsDir: $N/pod-logs
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "0%", imagefs.available: "0%", nodefs.inodesFree: "0%"}
serializeImagePulls: false
maxPods: 110
registerNode: true
registerWithTaints: [{key: pullman.dev/node, value: real, effect: NoSchedule}]
EOF
  start kubelet "$BIN/kubelet" \
    --config="$N/kubelet.yaml" --kubeconfig="$KC" --root-dir="$N/kubelet" --cert-dir="$N/kubelet/pki" \
    --hostname-override="$NODE_NAME" --node-ip="$NODE_GATEWAY" \
    --node-labels="pullman.dev/node=real" \
    --v=1

  cat > "$N/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$KC"}
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE_NAME
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:$proxy_healthz
metricsBindAddress: 127.0.0.1:$proxy_metrics
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {localhostNodePorts: false}
EOF
  start kube-proxy "$BIN/kube-proxy" --config="$N/kube-proxy.yaml" --v=1

  cat > "$N/Corefile" <<EOF
.:$dns_port {
    bind $NODE_GATEWAY
    errors
    health 127.0.0.1:$dns_health
    ready 127.0.0.1:$dns_ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $KC
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    forward . /etc/resolv.conf
    cache 30
}
EOF
  start coredns "$BIN/coredns" -conf "$N/Corefile"
  # The DNS Service any cluster has, its endpoint being CoreDNS on this machine.
  $k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  clusterIP: $DNS_IP
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: $dns_port}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: $dns_port}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-host
  namespace: kube-system
  labels:
    kubernetes.io/service-name: kube-dns
    endpointslice.kubernetes.io/managed-by: pullman.dev-testenv
addressType: IPv4
endpoints:
- addresses: [$NODE_GATEWAY]
  conditions: {ready: true}
ports:
- {name: dns, port: $dns_port, protocol: UDP}
- {name: dns-tcp, port: $dns_port, protocol: TCP}
EOF

  wait_until 60 "CoreDNS ready" coredns curl -fsS "http://127.0.0.1:$dns_ready/ready"
  wait_until 90 "node $NODE_NAME Ready" kubelet $k wait --for=condition=Ready "node/$NODE_NAME" --timeout=2s
  wait_until 30 "kube-proxy healthy" kube-proxy curl -fsS "http://127.0.0.1:$proxy_healthz/healthz"
  log "real node $NODE_NAME Ready ($(( SECONDS - t0 ))s): containerd $(containerd --version | awk '{print $3}'), pods $POD_CIDR on $BRIDGE"
}

# --- down ----------------------------------------------------------------------------------------
stop_pid() { # stop_pid <name> <timeout>: SIGTERM, then SIGKILL
  local f="$STATE/pids/$1.pid" p i
  [[ -f "$f" ]] || return 0
  p="$(cat "$f")"
  if kill -0 "$p" 2>/dev/null; then
    kill -TERM "$p" 2>/dev/null
    for (( i = 0; i < $2 * 10; i++ )); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$p" 2>/dev/null && { log "$1 (pid $p) ignored SIGTERM; killing it"; kill -KILL "$p" 2>/dev/null; sleep 0.2; }
  fi
  rm -f "$f"
  log "stopped $1"
}

down() {
  [[ -d "$N" ]] || return 0
  local k="kubectl --kubeconfig $STATE/kubeconfig --request-timeout=5s" i
  # Pods first, while the kubelet still runs: it stops their containers and tears their network
  # down through CNI. Whatever is left afterwards is removed by hand below.
  if [[ -S "$SOCK" ]] && alive kubelet; then
    $k delete pods -A --field-selector "spec.nodeName=$NODE_NAME" --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
    for (( i = 0; i < 150; i++ )); do
      [[ -z "$(ctr_ tasks ls -q 2>/dev/null)" ]] && break
      sleep 0.1
    done
  fi
  stop_pid kubelet 10
  stop_pid kube-proxy 5
  stop_pid coredns 5
  if [[ -S "$SOCK" ]]; then
    local id
    for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
    sleep 0.5
    for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$id" >/dev/null 2>&1 || true; done
    for id in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$id" >/dev/null 2>&1 || true; done
  fi
  stop_pid containerd 10
  # Shims of this containerd that outlived it (they are started with its socket address).
  pkill -KILL -f "containerd-shim-runc-v2 .*-address $SOCK" 2>/dev/null || true
  for (( i = 0; i < 50; i++ )); do pgrep -f "containerd-shim-runc-v2 .*-address $SOCK" >/dev/null || break; sleep 0.1; done
  # Processes of containers whose shims were killed (reparented to init): anything whose root is
  # in the node's directory.
  local p
  for p in /proc/[0-9]*; do
    [[ "$(readlink "$p/root" 2>/dev/null)" == "$N"/* ]] && { kill -KILL "${p#/proc/}" 2>/dev/null || true; }
  done
  # Network namespaces of sandboxes the kubelet did not stop (their veth pairs go with them).
  # containerd names them cni-<uuid> machine-wide: one real node per machine (see the top).
  local ns
  for ns in /var/run/netns/cni-*; do
    [[ -e "$ns" ]] || continue
    umount "$ns" 2>/dev/null || true; rm -f "$ns"
  done
  # Every mount under the node's directory (overlay roots, sandbox shm, tmpfs volumes), deepest first.
  local m
  while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(awk -v d="$N" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r)
  # Host ends of veths still on the bridge, then the bridge.
  local v
  for v in $(bridge_veths); do ip link del "$v" 2>/dev/null || true; done
  ip link del "$BRIDGE" 2>/dev/null || true
  # kube-proxy's, the kubelet's and the portmap plugin's chains and our own rules, in both
  # iptables back-ends, IPv4 and IPv6.
  local ipt tbl chain rule
  for ipt in iptables-nft iptables-legacy ip6tables-nft ip6tables-legacy; do
    command -v "$ipt" >/dev/null || continue
    for tbl in nat filter mangle; do
      { $ipt -t "$tbl" -S 2>/dev/null || true; } \
        | awk '$1 == "-A" && ($2 ~ /^(KUBE|CNI)-/ || $0 ~ / -j (KUBE|CNI)-/ || $0 ~ /pullman-testenv/) { print }' \
        | sed 's/^-A /-D /' | while read -r rule; do eval "$ipt -t $tbl $rule" 2>/dev/null || true; done
      for chain in $({ $ipt -t "$tbl" -S 2>/dev/null || true; } | awk '$1 == "-N" && $2 ~ /^(KUBE|CNI)-/ { print $2 }'); do
        $ipt -t "$tbl" -F "$chain" 2>/dev/null || true
      done
      for chain in $({ $ipt -t "$tbl" -S 2>/dev/null || true; } | awk '$1 == "-N" && $2 ~ /^(KUBE|CNI)-/ { print $2 }'); do
        $ipt -t "$tbl" -X "$chain" 2>/dev/null || true
      done
    done
  done
  # The kubelet links every container log into /var/log/containers, whatever podLogsDir says.
  local l
  for l in /var/log/containers/*.log; do
    [[ -L "$l" && "$(readlink "$l")" == "$N"/* ]] && rm -f "$l"
  done
  left_behind || return 1
  rm -rf "$N"
  log "real node removed"
}

# Host ends of veth pairs attached to the bridge.
bridge_veths() {
  ip -o link show master "$BRIDGE" type veth 2>/dev/null | awk -F': ' '{ print $2 }' | cut -d@ -f1
}

# One line for each thing the real node left on this machine; non-zero if there is any.
left_behind() {
  local left=() ipt
  ip link show "$BRIDGE" >/dev/null 2>&1 && left+=("bridge $BRIDGE")
  [[ -n "$(bridge_veths)" ]] && left+=("veths on $BRIDGE")
  local p
  for p in /proc/[0-9]*; do
    [[ "$(readlink "$p/root" 2>/dev/null)" == "$N"/* ]] && { left+=("processes of its containers"); break; }
  done
  [[ -n "$(awk -v d="$N" 'index($2, d) == 1' /proc/mounts)" ]] && left+=("mounts under $N")
  compgen -G "/var/run/netns/cni-*" >/dev/null && left+=("network namespaces /var/run/netns/cni-*")
  pgrep -f "containerd-shim-runc-v2 .*-address $SOCK" >/dev/null && left+=("containerd shims")
  for ipt in iptables-nft iptables-legacy ip6tables-nft ip6tables-legacy; do
    command -v "$ipt-save" >/dev/null || continue
    [[ -n "$({ $ipt-save 2>/dev/null || true; } | grep -E '^[:-].* (KUBE|CNI)-|^:(KUBE|CNI)-|pullman-testenv')" ]] && left+=("$ipt rules or chains")
  done
  (( ${#left[@]} == 0 )) && return 0
  log "ERROR: left behind: ${left[*]}"
  return 1
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  check) check ;;
  *) echo "usage: node.sh up|down|check" >&2; exit 2 ;;
esac
