#!/usr/bin/env bash
# Stop the control plane started by up.sh: SIGTERM every recorded process
# (clients, then the real node with its pods, containers, mounts, veths and
# iptables chains, then kube-apiserver, then etcd), SIGKILL whatever is left after a timeout, then remove
# the state directory. Only pids recorded in <state>/pids are signalled, and
# only if they still run a binary from the recorded bin dir.
#
# Environment:
#   PULLMAN_TESTENV_STATE         state dir (default /tmp/pullman-testenv)
#   PULLMAN_TESTENV_STOP_TIMEOUT  seconds between SIGTERM and SIGKILL (default 10)
#   PULLMAN_TESTENV_KEEP_STATE    set to 1 to keep the state dir (logs) after stopping
set -uo pipefail

STATE="${PULLMAN_TESTENV_STATE:-/tmp/pullman-testenv}"
STOP_TIMEOUT="${PULLMAN_TESTENV_STOP_TIMEOUT:-10}"
log() { echo "down.sh: $*" >&2; }

if [[ ! -d "$STATE" ]]; then
  log "nothing to do ($STATE does not exist)"
  exit 0
fi

# running <pid>: alive and not a zombie (zombies linger where PID 1 does not reap).
running() {
  kill -0 "$1" 2>/dev/null || return 1
  local st
  st="$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null)" || return 0
  [[ "$st" != Z ]]
}

# pid_of <name>: recorded pid, if that process is alive and is our binary.
pid_of() {
  local f="$STATE/pids/$1.pid" pid exe
  [[ -f "$f" ]] || return 1
  pid="$(cat "$f")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  running "$pid" || return 1
  exe="$(readlink "/proc/$pid/exe" 2>/dev/null || true)"
  if [[ -n "$exe" && "${exe##*/}" != "$1" && "${exe##*/}" != "$1 (deleted)" ]]; then
    log "pid $pid is no longer $1 ($exe); not signalling it"
    return 1
  fi
  echo "$pid"
}

# stop_wave <name>...: SIGTERM all of them, wait, SIGKILL leftovers.
stop_wave() {
  local name pid i t0=$SECONDS alive_any
  local -A pids=()
  for name in "$@"; do
    if pid="$(pid_of "$name")"; then
      pids[$name]=$pid
      kill -TERM "$pid" 2>/dev/null
    else
      rm -f "$STATE/pids/$name.pid"
    fi
  done
  (( ${#pids[@]} )) || return 0
  for (( i = 0; i < STOP_TIMEOUT * 10; i++ )); do
    alive_any=0
    for name in "${!pids[@]}"; do running "${pids[$name]}" && alive_any=1; done
    (( alive_any )) || break
    sleep 0.1
  done
  local wave_rc=0
  for name in "${!pids[@]}"; do
    pid=${pids[$name]}
    if running "$pid"; then
      log "$name (pid $pid) did not exit after ${STOP_TIMEOUT}s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null
      for (( i = 0; i < 50; i++ )); do running "$pid" || break; sleep 0.1; done
    fi
    if running "$pid"; then
      log "ERROR: $name (pid $pid) is still running"
      wave_rc=1
    else
      log "stopped $name (pid $pid)"
      rm -f "$STATE/pids/$name.pid"
    fi
  done
  log "wave [$*] done in $(( SECONDS - t0 ))s"
  return $wave_rc
}

rc=0
# Clients first, then the apiserver, then its storage.
stop_wave kwok kube-scheduler kube-controller-manager || rc=1
# The real node (node.sh) while the API server still answers: its pods go first.
if [[ -d "$STATE/node" ]]; then
  STATE="$STATE" "$(dirname "${BASH_SOURCE[0]}")/node.sh" down || rc=1
fi
stop_wave kube-apiserver || rc=1
stop_wave etcd || rc=1

if [[ $rc != 0 ]]; then
  log "some processes could not be stopped; keeping $STATE"
  exit 1
fi
if [[ ! -f "$STATE/.pullman-testenv" ]]; then
  log "$STATE has no .pullman-testenv marker; not removing it"
elif [[ "${PULLMAN_TESTENV_KEEP_STATE:-0}" == 1 ]]; then
  log "stopped; state kept in $STATE"
else
  rm -rf "$STATE"
  log "stopped; removed $STATE"
fi
