#!/usr/bin/env bash
# Runs schemathesis (every phase, stateful included, every check) against the OpenAPI document a
# real `pullman serve` serves, on an embedded PostgreSQL, and fails on any failure (issue #14:
# "The OpenAPI must describe the server").
#
# Builds nothing: uses ${PULLMAN_BIN:-target/debug/pullman}. Installs schemathesis (pinned) into a
# venv under ${XDG_CACHE_HOME:-$HOME/.cache}/pullman-schemathesis on first use (needs python3 with
# venv support and PyPI), with openapi-spec-validator (pinned), which checks the document first.
# Registers an agent and lets hooks.py aim the agent routes (claim, heartbeat, complete,
# claim-next, pending) at that agent and at real orders; prints, per operation, how many answers
# of each status schemathesis got.
#
# Usage: e2e/schemathesis/run.sh [extra `st run` arguments, e.g. --max-time 60 or --seed 1]
# Env: ST_MAX_TIME (seconds for the whole run, default 180), ST_MAX_EXAMPLES (default 50),
# ST_WORKERS (default 1: with 2, hypothesis' lambda descriptions raced in CPython 3.11's
# `ast.parse` and errored with "AST constructor recursion depth mismatch").
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
# shellcheck source=../lib/serve.sh
. "$root/e2e/lib/serve.sh"

ST_VERSION=4.32.5
OSV_VERSION=0.9.0
serve_bin

venv="${XDG_CACHE_HOME:-$HOME/.cache}/pullman-schemathesis"
if [ "$("$venv/bin/st" --version 2>/dev/null | grep -o '[0-9][0-9.]*' | head -1)" != "$ST_VERSION" ]; then
  echo "==> installing schemathesis $ST_VERSION into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$ST_VERSION"
fi
# What a generated client's tooling checks first: the document is valid OpenAPI (issue #26).
if [ "$("$venv/bin/pip" show openapi-spec-validator 2>/dev/null | sed -n 's/^Version: //p')" != "$OSV_VERSION" ]; then
  "$venv/bin/pip" install --quiet --disable-pip-version-check "openapi-spec-validator==$OSV_VERSION"
fi

serve_work schemathesis

export PULLMAN_ADMIN_TOKEN="st-admin-$(python3 -c 'import secrets; print(secrets.token_hex(24))')"
serve_start "$bin" "$work" --maintenance-interval-seconds 1

echo "==> registering the agent schemathesis claims as"
agent_json="$(curl -sf -X POST "$base/api/v1/agents" -H "Authorization: Bearer $PULLMAN_ADMIN_TOKEN" \
  -H 'Content-Type: application/json' -d '{"name":"schemathesis","labels":["schemathesis"]}')"
export PULLMAN_ST_AGENT_ID="$(printf '%s' "$agent_json" | python3 -c 'import json,sys; print(json.load(sys.stdin)["agent"]["id"])')"
export PULLMAN_ST_AGENT_TOKEN="$(printf '%s' "$agent_json" | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')"
echo "    agent $PULLMAN_ST_AGENT_ID"
echo "==> creating 20 orders targeted at it"
for i in $(seq 20); do
  curl -sf -o /dev/null -X POST "$base/api/v1/work-orders" -H "Authorization: Bearer $PULLMAN_ADMIN_TOKEN" \
    -H 'Content-Type: application/json' \
    -d "{\"work_type\":\"custom\",\"targeting\":{\"agent_ids\":[\"$PULLMAN_ST_AGENT_ID\"]},\"yaml_content\":\"apiVersion: v1\\nkind: ConfigMap\\nmetadata:\\n  name: seed-$i\\n\"}"
done

echo "==> openapi-spec-validator $OSV_VERSION on the served document"
curl -sf "$base/api/v1/openapi.json" -o "$work/openapi.json"
"$venv/bin/openapi-spec-validator" "$work/openapi.json" || { echo "the served OpenAPI document is not valid" >&2; exit 1; }

export PULLMAN_ST_BASE="$base/api/v1"
export PULLMAN_ST_COUNTS="$work/counts.json"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"

echo "==> schemathesis $ST_VERSION: every phase, every check"
status=0
# From $work, so that schemathesis and hypothesis leave nothing in the source tree.
(cd "$work" && "$venv/bin/st" --config-file "$here/schemathesis.toml" run "$base/api/v1/openapi.json" \
  --phases examples,coverage,fuzzing,stateful \
  --checks all \
  --max-examples "${ST_MAX_EXAMPLES:-50}" \
  --max-time "${ST_MAX_TIME:-180}" \
  --workers "${ST_WORKERS:-1}" \
  --request-timeout 40 \
  --report junit --report-dir "$work/report" \
  "$@") || status=$?

echo "==> answers per operation (status: count), as schemathesis got them"
python3 - "$PULLMAN_ST_COUNTS" <<'PY'
import json, sys
try:
    counts = json.load(open(sys.argv[1]))
except FileNotFoundError:
    counts = {}
for op in sorted(counts, key=lambda k: (k.split(" ", 1)[1], k)):
    by = counts[op]
    if set(by) == {"405"}:
        continue  # unsupported_method probes of undeclared methods
    ok = sum(n for s, n in by.items() if s.startswith("2"))
    print(f"  {op:48} 2xx={ok:<5} " + " ".join(f"{s}:{by[s]}" for s in sorted(by)))
missing = [op for op in ("POST /work-orders/{id}/claim", "POST /work-orders/{id}/heartbeat",
                         "POST /work-orders/{id}/complete", "POST /agents/{id}/claim")
           if not any(s.startswith("2") for s in counts.get(op, {}))]
if missing:
    print("no 2xx answer on: " + ", ".join(missing), file=sys.stderr)
    sys.exit(1)
PY
[ "$status" = 0 ] || { echo "schemathesis found failures (exit $status); serve log tail:" >&2; tail -20 "$work/serve.log" >&2; }
exit "$status"
