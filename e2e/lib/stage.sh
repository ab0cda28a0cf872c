# Stage timing for the CI scripts (.ci/run, e2e/run-tests.sh): source it, then call
#   stage "what starts now"   prints how long the previous stage took and the total so far, then
#                             "==> what starts now"
#   stage_end                 prints the last stage's time and the total
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
