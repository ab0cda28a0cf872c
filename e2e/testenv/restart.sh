#!/usr/bin/env bash
# Restarts one process of the test control plane or its real node (started by up.sh or node.sh)
# with the command line and environment it was started with, for fault tests: a kube-apiserver
# restarted under the executor's watches and log streams (issue #35), a kubelet stopped under a
# running pod (issue #39).
#   e2e/testenv/restart.sh <component> [seconds down] [signal]
# <component> names a pid file under $PULLMAN_TESTENV_STATE/pids (kube-apiserver, kubelet, …).
# Sends the signal (default TERM; KILL for a crash), then SIGKILL if it still runs after 20 s (a
# kube-apiserver told TERM keeps running that long with watches open); waits the seconds down
# (default 0); starts it again detached,
# its output appended to the same log, and records the new pid. Does not wait for it to be ready:
# the caller knows what ready means (e.g. `kubectl get --raw /readyz`).
set -euo pipefail
STATE="${PULLMAN_TESTENV_STATE:-/tmp/pullman-testenv}"
die() { echo "restart.sh: $*" >&2; exit 1; }
(( $# >= 1 )) || die "usage: restart.sh <component> [seconds down] [signal]"
comp="$1" down="${2:-0}" signal="${3:-TERM}"
pidf="$STATE/pids/$comp.pid"
pid="$(cat "$pidf" 2>/dev/null)" || die "no pid file $pidf (is the test control plane up in $STATE?)"
kill -0 "$pid" 2>/dev/null || die "$comp (pid $pid) is not running"
mapfile -d '' cmd < "/proc/$pid/cmdline"
mapfile -d '' envs < "/proc/$pid/environ"
(( ${#cmd[@]} > 0 )) || die "cannot read the command line of $comp (pid $pid)"
kill -"$signal" "$pid"
for _ in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; sleep 0.5; fi
sleep "$down"
setsid env -i "${envs[@]}" "${cmd[@]}" >>"$STATE/logs/$comp.log" 2>&1 </dev/null &
echo $! > "$pidf"
echo "$!"
