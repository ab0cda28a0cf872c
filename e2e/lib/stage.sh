# shellcheck shell=bash
# Stage timing and background builds for the CI scripts (.ci/run, e2e/run-tests.sh): source it,
# then call
#   stage "what starts now"   prints how long the previous stage took and the total so far, then
#                             "==> what starts now"
#   stage_end                 prints the last stage's time and the total
#   in_background NICE LOG CMD [ARGS...]
#                             starts CMD in a session of its own (so `kill -- -$bg_pid` stops all
#                             of it, children included) at nice NICE, output to LOG; sets bg_pid
#   await_background WHAT PID LOG
#                             waits for PID (started by in_background); on failure prints LOG and
#                             exits 1 naming WHAT, else says how long it waited and removes LOG
# so a slow stage is seen in every CI log before it sinks a submission. Times are whole seconds
# of wall clock (bash's SECONDS). PULLMAN_CI_T0 carries the start across an exec, so the total of
# e2e/run-tests.sh under .ci/run counts from .ci/run's start.
export PULLMAN_CI_T0="${PULLMAN_CI_T0:-$(date +%s)}"
stage_name=""
stage_t0=0

stage() {
  stage_end
  stage_name="$1"
  stage_t0=$(date +%s)
  echo "==> $1"
}

stage_end() {
  local now
  now=$(date +%s)
  if [[ -n "$stage_name" ]]; then
    echo "    [time] ${stage_name%% (*}: $((now - stage_t0)) s (total $((now - PULLMAN_CI_T0)) s)"
  fi
  stage_name=""
}

# The session's autogroup is niced too: with the kernel's autogroups (sched_autogroup_enabled=1,
# as on the CI machines), each session competes with the others as one group, whatever the nice
# of its processes. A plain `setsid nice -n 10` build took as much CPU as all of the foreground
# (two such spinners here got twice the foreground's share; with /proc/self/autogroup at nice 19,
# 3 % of it), so "background" Go builds slowed the Rust build they were meant to give way to.
# Where autogroups are off, the write fails and nice alone does the job. Beside tests that wait
# on round trips and fsyncs rather than on the CPU, even the lowest priority still slows them
# 1.2-3 x (.ci/run, at the throughput guard): a background build pays off only where it would
# otherwise run alone on the critical path, as a cold Go build would.
in_background() {
  local nice="$1" log="$2"
  shift 2
  # shellcheck disable=SC2016 # expanded by the inner bash
  setsid bash -c 'echo "$0" >/proc/self/autogroup 2>/dev/null || true; exec nice -n "$0" "$@"' \
    "$nice" "$@" >"$log" 2>&1 </dev/null &
  bg_pid=$!
}

await_background() {
  local what="$1" pid="$2" log="$3" t0=$SECONDS
  wait "$pid" || { cat "$log"; echo "$what did not build (log: $log)" >&2; exit 1; }
  echo "    (waited $((SECONDS - t0)) s for $what)"
  rm -f "$log"
}
