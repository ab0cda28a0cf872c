# Sourced by e2e/keda/test.sh with burst-executor at 0: KEDA's 1 -> N through its HPA (issue #35).
# 20 orders whose Jobs run 5-14 s (kwok's pullman.dev/kwok-run-duration) for the Executor `burst`
# (targetValue 4, maxReplicas 8): KEDA activates the Deployment (0 -> 1), then its HPA, reading the
# backlog's `total` (waiting plus in flight) through keda-adapter, scales it to ceil(20 / 4) = 5,
# never more; as orders finish, the HPA scales down (stabilization 0) while others still run, and
# the replicas that go drain: every order succeeds, each in exactly one attempt.
# The orders last at most 14 s, well under the executor's 20 s drain (`--drain-seconds`) with the
# Job's own start-up on a loaded machine: a longer order on a replica removed would be handed on
# to another one (a second attempt), which docs/keda.md describes and this test counts as a failure.
#
# Uses from test.sh: k, step, ok, fail, supervise, replicas, orders_state, API, ADMIN, NS, WORK,
# KEDA_PID.

# job_orders: creates the 20 orders from one process, in well under a second (the HPA's first
# read then sees them all), and prints their ids. Order i's Job's pod runs 5 + (i % 4) * 3 s.
job_orders() {
  python3 - "$API" "$ADMIN" <<'PY'
import json, sys, urllib.request
api, token = sys.argv[1], sys.argv[2]
for i in range(20):
    secs = 5 + (i % 4) * 3
    yaml = f"""apiVersion: batch/v1
kind: Job
metadata: {{name: keda-job-{i}}}
spec:
  backoffLimit: 0
  template:
    metadata: {{annotations: {{pullman.dev/kwok-run-duration: "{secs}s"}}}}
    spec:
      restartPolicy: Never
      containers: [{{name: main, image: busybox, command: [sleep, "{secs}"]}}]
"""
    body = json.dumps({"work_type": "custom", "targeting": {"labels": ["keda-burst"]},
                       "yaml_content": yaml, "claim_timeout_seconds": 300}).encode()
    req = urllib.request.Request(f"{api}/api/v1/work-orders", data=body, method="POST",
                                 headers={"Authorization": f"Bearer {token}",
                                          "Content-Type": "application/json"})
    print(json.load(urllib.request.urlopen(req, timeout=30))["id"])
PY
}

step "1 -> N: 20 orders whose Jobs run 5-14 s, for burst (targetValue 4, maxReplicas 8)"
mapfile -t N_IDS < <(job_orders)
(( ${#N_IDS[@]} == 20 )) || fail "created ${#N_IDS[@]} of the 20 orders"
t0=$SECONDS peak=0 last=0 finished=0 shrank="" metric_at_peak=""
until (( finished == 20 )) && [[ "$(replicas)" == 0 ]]; do
  kill -0 "$KEDA_PID" 2>/dev/null || fail "the KEDA operator exited"
  (( SECONDS - t0 < 180 )) || fail "1 -> N: not done within 180s (replicas $(replicas), $finished of 20 orders finished)"
  supervise
  # A slow API call on a loaded machine skips a second; it never ends the test unexplained.
  now="$(replicas)" || { sleep 1; continue; }
  state="$(orders_state "${N_IDS[@]}")" || { sleep 1; continue; }
  read -r finished bad <<<"$state"
  [[ -z "$bad" ]] || fail "orders that did not succeed in exactly one attempt: $bad"
  if (( now > peak )); then
    peak=$now
    metric_at_peak="$(k -n "$NS" get hpa keda-hpa-burst-executor \
      -o jsonpath='current {.status.currentReplicas}, desired {.status.desiredReplicas}')" || metric_at_peak="?"
  fi
  if (( now < last && finished < 20 && now > 0 )) && [[ -z "$shrank" ]]; then
    shrank="$((SECONDS - t0))s: $last -> $now replicas with $((20 - finished)) orders unfinished"
  fi
  last=$now
  sleep 1
done
ok "all 20 orders succeeded, each in exactly one attempt; burst-executor back to 0 ($((SECONDS - t0))s)"
(( peak == 5 )) || fail "the HPA scaled burst-executor to $peak replicas at most, not ceil(20 / 4) = 5"
ok "the HPA scaled burst-executor to 5 = ceil(20 / 4), never more (HPA at the peak: $metric_at_peak)"
rescaled="$(k -n "$NS" get events --field-selector involvedObject.name=keda-hpa-burst-executor,reason=SuccessfulRescale \
  -o jsonpath='{range .items[*]}{.message}{"\n"}{end}')"
grep -q "New size: 5; reason: external metric s0-metric-api-total" <<<"$rescaled" \
  || fail "no SuccessfulRescale Event of the HPA to 5 on its external metric; its Events: $rescaled"
ok "the HPA's own Event: $(grep -m1 'New size: 5' <<<"$rescaled")"
[[ -n "$shrank" ]] || fail "the HPA never scaled down while orders still ran, so no replica was removed mid-order"
# The first scale-down comes once a few orders have finished, while each replica still runs
# some; the orders of the replicas removed must have completed after their SIGTERM ("draining"),
# not been handed on.
drained="$(python3 - "$WORK" <<'PY'
import glob, sys
n = 0
for f in glob.glob(sys.argv[1] + "/executor-*.log"):
    lines = open(f, errors="replace").read().splitlines()
    at = next((i for i, l in enumerate(lines) if "draining" in l), None)
    if at is not None:
        n += sum(1 for l in lines[at:] if " completed" in l)
print(n)
PY
)"
(( drained > 0 )) || fail "no order completed on a replica after its SIGTERM: the scale-down removed none mid-order"
ok "the HPA scaled down while orders still ran ($shrank); $drained orders completed on replicas after their SIGTERM"
