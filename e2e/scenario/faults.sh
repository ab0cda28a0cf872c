# shellcheck shell=bash
# Faults under running orders, sourced by run.sh after its other steps (it defines k, step, ok,
# fail, until_true, job_order, phase, has_phase, executor_pod, order_id, count_text, $PULLMAN,
# $DEMO, $WORK). Last, so what they disturb (watches, leases, the executor's pod) cannot weigh on
# the figures and checks before them.

# --- 11. the executor killed as its order's Job finishes ------------------------------------------
step "the executor killed (grace 0) as its order's Job finishes: the next claim brings the last lines and the verdict"
EXEC="$(executor_pod)"
job_order finishing 'echo first; sleep 5; echo last' 3600 | k apply -n "$DEMO" -f - >/dev/null
has_finishing_id() { [[ -n "$(order_id finishing)" ]]; }
until_true 60 "WorkOrder finishing has its order id" has_finishing_id
first_sent() { "$PULLMAN" work-orders logs "$(order_id finishing)" 2>/dev/null | grep -q '] first$'; }
until_true 90 "finishing's first line stored" first_sent
t_kill=$(now)
k delete pod -n "$DEMO" "$EXEC" --grace-period=0 --force >/dev/null 2>&1 || fail "deleting executor pod $EXEC"
# The claim's lease (15 s) ends, the reaper hands the order out again, and the new pod's executor
# finds the Job already finished: the finished pod's last line is read before the order completes.
until_true 180 "WorkOrder finishing Succeeded after its executor was killed" has_phase finishing Succeeded
"$PULLMAN" work-orders logs "$(order_id finishing)" > "$WORK/finishing.out" || fail "work-orders logs finishing"
for t in first last; do
  (( $(count_text "$WORK/finishing.out" "$t") == 1 )) \
    || { cat "$WORK/finishing.out" >&2; fail "finishing's line '$t' is not in its output exactly once"; }
done
reclaims="$(k get -n "$DEMO" workorder finishing -o jsonpath='{.status.reclaimCount}')"
(( reclaims >= 1 )) || fail "finishing was not reclaimed (reclaimCount '$reclaims'): the kill did not land under it"
pods="$(k get pods -n "$DEMO" -l batch.kubernetes.io/job-name=finishing -o name | wc -l)"
(( pods == 1 )) || fail "Job finishing has $pods pods, not 1"
jobs="$(k get jobs -n "$DEMO" -l "pullman.dev/work-order=$(order_id finishing)" -o name | wc -l)"
(( jobs == 1 )) || fail "order finishing has $jobs Jobs, not 1"
ok "finishing Succeeded $(since "$t_kill") s after its executor was killed; 'first' and 'last' once each, one Job, one pod"

# --- 12. the API server restarted while a container's log streams ---------------------------------
if [[ -n "${SCENARIO_RESTART_APISERVER:-}" ]]; then
  step "the API server restarted while a container's log streams: every line once"
  # 40 lines a second apart: the stream breaks at the third and is opened again while the
  # container still prints.
  job_order beats 'i=1; while [ $i -le 40 ]; do echo beat $i; i=$((i + 1)); sleep 1; done' 3600 \
    | k apply -n "$DEMO" -f - >/dev/null
  has_beats_id() { [[ -n "$(order_id beats)" ]]; }
  until_true 60 "WorkOrder beats has its order id" has_beats_id
  beats_id="$(order_id beats)"
  third_beat() { "$PULLMAN" work-orders logs "$beats_id" 2>/dev/null | grep -q '] beat 3$'; }
  until_true 90 "beats' third line stored" third_beat
  t_restart=$(now)
  bash -c "$SCENARIO_RESTART_APISERVER" >/dev/null || fail "restarting the API server ($SCENARIO_RESTART_APISERVER)"
  api_ready() { k get --raw /readyz; }
  until_true 90 "the API server ready again" api_ready
  down="$(since "$t_restart")"
  beats_running() { [[ -n "$(k get pods -n "$DEMO" -l batch.kubernetes.io/job-name=beats --field-selector=status.phase=Running -o name)" ]]; }
  beats_running || fail "beats' container had ended before the API server came back: the restart was not mid-stream"
  until_true 180 "WorkOrder beats Succeeded after the API server restart" has_phase beats Succeeded
  "$PULLMAN" work-orders logs "$beats_id" > "$WORK/beats.out" || fail "work-orders logs beats"
  for i in $(seq 1 40); do
    (( $(count_text "$WORK/beats.out" "beat $i") == 1 )) \
      || { cat "$WORK/beats.out" >&2; fail "beats' line 'beat $i' is not in its output exactly once"; }
  done
  # Each of its phase Events (Queued, Claimed, Succeeded) once: the watches that resumed after
  # the restart re-listed the WorkOrder, and a re-list must not say a change again.
  k get events.events.k8s.io -n "$DEMO" -o json > "$WORK/beats-events.json" || fail "listing Events"
  python3 - "$WORK/beats-events.json" <<'PY' || fail "WorkOrder beats has a repeated Event"
import collections, json, sys
seen = collections.Counter()
for e in json.load(open(sys.argv[1]))["items"]:
    r = e.get("regarding", {})
    if r.get("kind") == "WorkOrder" and r.get("name") == "beats":
        seen[e.get("reason")] += (e.get("series") or {}).get("count", 1)
print(f"    beats' Events: {dict(seen)}")
assert seen["Succeeded"] == 1 and all(n == 1 for n in seen.values()), seen
PY
  ok "the API server was back in ${down} s; beats Succeeded with its 40 lines, each once, and each Event once"
  figure "API server restart → ready again (s)" "$down"
fi
