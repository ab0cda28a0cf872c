"""Schemathesis hooks for e2e/schemathesis/run.sh.

The agent routes only do something real when they name the agent of the token and an order that
agent holds. Before each call to one of them, these hooks put real values into the generated
case, but only where the generated value is itself valid (a UUID), so that negative cases
(a malformed id, a wrong type) still reach the server as generated:

- `/agents/{id}/claim` and `/agents/{id}/work-orders/pending`: `{id}` becomes the agent's id;
  claim-next waits at most 1 s (the server caps waits at 30 s; a long wait tests nothing more),
  and half the time an order for the agent is created first so that it claims a real one;
- `/work-orders/{id}/claim`: `{id}` becomes a fresh pending order targeted at the agent (or
  stays, when it already names an active order), `agent_id` the agent's id;
- `/agents/{id}/complete` (a batch complete): `{id}` becomes the agent's id; in positive cases
  the first item whose `work_order_id` is a UUID names an order the agent holds (and its
  `claim_id`, when a UUID, that claim), the others fresh UUIDs (unknown orders, answered `404`
  inside the `200`): an order twice in one batch is `400` by design, which no schema states;
- `/work-orders/{id}/heartbeat|complete|output` (POST): `{id}` becomes an order the agent holds (a fresh one
  is created and claimed), `agent_id` the agent's id and `claim_id`, when present, its claim id;
- `POST /work-orders`: a `yaml_content` string (within its 1 MiB) becomes a valid manifest for
  the order's `work_type` (a ConfigMap, or a Shipwright Build for `build`): what YAML must hold
  (docs/design.md §5: parses, `apiVersion`/`kind`/`metadata` in each document) is beyond a schema;
- list routes: a `cursor` becomes a `next_cursor` the server issued for that list (or is
  dropped when the list has one page): a cursor is opaque, only issued ones are valid
  (`400 invalid_cursor` otherwise), which a schema cannot state;
- `POST /work-orders` and `POST /work-orders/{id}/rerun`: a valid `Idempotency-Key` becomes a
  fresh one: a key reused with another request is `422 idempotency_key_reused` by design, and generated keys repeat (`0`, `null`);
- `DELETE /agents/{id}` and `POST /agents/{id}/token` never touch the agent of this run (the
  stateful phase finds its id in the lists): they get a throwaway agent instead.

After each call the status is counted per operation into $PULLMAN_ST_COUNTS (JSON), which
run.sh prints at the end.
"""

import json
import os
import random
import re
import threading
import uuid

import requests

import schemathesis

BASE = os.environ["PULLMAN_ST_BASE"]  # http://127.0.0.1:<port>/api/v1
ADMIN = {"Authorization": "Bearer " + os.environ["PULLMAN_ADMIN_TOKEN"]}
AGENT_ID = os.environ["PULLMAN_ST_AGENT_ID"]
AGENT = {"Authorization": "Bearer " + os.environ["PULLMAN_ST_AGENT_TOKEN"]}
COUNTS_FILE = os.environ.get("PULLMAN_ST_COUNTS")

BUILD_YAML = (
    "apiVersion: shipwright.io/v1beta1\nkind: Build\nmetadata:\n  name: schemathesis\n"
    "spec:\n  source: {type: Git, git: {url: https://example.com/app.git}}\n"
    "  output: {image: registry.example.com/app}\n"
)
YAML = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: schemathesis\ndata:\n  k: v\n"

_session = requests.Session()
_lock = threading.Lock()
_counts = {}


def _is_uuid(value):
    if not isinstance(value, str):
        return False
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def _create_order():
    r = _session.post(
        BASE + "/work-orders",
        headers=ADMIN,
        json={"work_type": "custom", "yaml_content": YAML, "targeting": {"agent_ids": [AGENT_ID]}},
        timeout=30,
    )
    r.raise_for_status()
    return r.json()["id"]


def _throwaway_agent():
    r = _session.post(
        BASE + "/agents", headers=ADMIN, json={"name": "throwaway-" + uuid.uuid4().hex}, timeout=30
    )
    r.raise_for_status()
    return r.json()["agent"]["id"]


def _claimed_order():
    """A fresh order claimed by the agent: (order id, claim id)."""
    order_id = _create_order()
    r = _session.post(
        BASE + f"/work-orders/{order_id}/claim",
        headers=AGENT,
        json={"agent_id": AGENT_ID, "lease_seconds": 300},
        timeout=30,
    )
    r.raise_for_status()
    return order_id, r.json()["claim_id"]


def _active_order(order_id):
    r = _session.get(BASE + f"/work-orders/{order_id}", headers=ADMIN, timeout=30)
    return r.json() if r.status_code == 200 else None


def _visible(order):
    """Whether the agent of this run may see `order` (docs/design.md §3; it has no tenant, all work
    types, the name and label `schemathesis`). Claiming an order it may not see is `404` by
    docs/design.md §5, which ensure_resource_availability would take for a lost order."""
    if order is None:
        return False
    t = order.get("targeting") or {}
    return (
        AGENT_ID in (t.get("agent_ids") or [])
        or "schemathesis" in (t.get("agent_names") or [])
        or "schemathesis" in (t.get("labels") or [])
    )


def _positive(case):
    meta = getattr(case, "meta", None)
    return meta is None or not meta.generation.mode.is_negative


def _op(case):
    return case.operation.path.removeprefix("/api/v1")


LISTS = ("/agents", "/work-orders", "/work-order-log", "/agents/{id}/work-orders/pending")


def _real_cursor(path, params):
    auth = AGENT if path.endswith("/pending") else ADMIN
    url = BASE + path.replace("{id}", str(params.get("id", "")))
    r = _session.get(url, headers=auth, params={"limit": 1}, timeout=30)
    return r.json().get("next_cursor") if r.status_code == 200 else None


@schemathesis.hook
def before_call(context, case, kwargs):
    path = _op(case)
    params = case.path_parameters if case.path_parameters is not None else {}
    body = case.body if isinstance(case.body, dict) else None
    if path == "/agents/{id}/work-orders/pending" and _is_uuid(params.get("id")):
        params["id"] = AGENT_ID
    query = case.query if isinstance(case.query, dict) else None
    if path in LISTS and case.method.upper() == "GET" and query is not None:
        if isinstance(query.get("cursor"), str):
            cursor = _real_cursor(path, params)
            if cursor is None:
                del query["cursor"]
            else:
                query["cursor"] = cursor
    if path in ("/agents/{id}", "/agents/{id}/token") and case.method.upper() in ("DELETE", "POST"):
        if params.get("id") == AGENT_ID:
            params["id"] = _throwaway_agent()
    elif path in ("/work-orders", "/work-orders/{id}/rerun") and case.method.upper() == "POST":
        headers = case.headers  # a case-insensitive mapping, not a dict
        key = headers.get("Idempotency-Key") if headers is not None else None
        # Positive cases only: editing a header revalidates the case, which would turn a
        # negative one (e.g. Authorization left out on purpose) positive and send the header.
        if _positive(case) and isinstance(key, str) and re.fullmatch(r"[!-~]{1,255}", key):
            headers["Idempotency-Key"] = uuid.uuid4().hex
        if body is not None and isinstance(body.get("yaml_content"), str) and len(
            body["yaml_content"].encode("utf-8", "surrogatepass")
        ) <= 1024 * 1024:
            body["yaml_content"] = BUILD_YAML if body.get("work_type") == "build" else YAML
    elif path in ("/agents/{id}/claim", "/agents/{id}/work-orders/pending"):
        if _is_uuid(params.get("id")):
            params["id"] = AGENT_ID
            if path.endswith("/claim") and random.random() < 0.5:
                _create_order()
        wait = body.get("max_wait_seconds") if body is not None else None
        if isinstance(wait, (int, float)) and not isinstance(wait, bool) and wait > 1:
            body["max_wait_seconds"] = 1
    elif path == "/agents/{id}/complete":
        if _is_uuid(params.get("id")):
            params["id"] = AGENT_ID
        items = body.get("completes") if body is not None else None
        if _positive(case) and isinstance(items, list):
            real = True
            for item in items:
                if isinstance(item, dict) and _is_uuid(item.get("work_order_id")):
                    if real:
                        item["work_order_id"], claim_id = _claimed_order()
                        if _is_uuid(item.get("claim_id")):
                            item["claim_id"] = claim_id
                        real = False
                    else:
                        item["work_order_id"] = str(uuid.uuid4())
    elif path == "/work-orders/{id}/claim":
        if _is_uuid(params.get("id")) and not _visible(_active_order(params["id"])):
            params["id"] = _create_order()
        if body is not None and _is_uuid(body.get("agent_id")):
            body["agent_id"] = AGENT_ID
    elif path == "/work-orders/{id}/output" and case.method.upper() == "GET":
        # follow=true streams until the order finishes: read a page instead. `tail` excludes
        # `after` and `limit` is for pages (both documented on the parameters): keep one of each.
        if query is not None:
            query.pop("follow", None)
            if "tail" in query:
                query.pop("after", None)
    elif path in ("/work-orders/{id}/heartbeat", "/work-orders/{id}/complete", "/work-orders/{id}/output"):
        if _is_uuid(params.get("id")):
            order = _active_order(params["id"])
            if order is not None and order.get("claimed_by") == AGENT_ID and order.get("claim_id"):
                claim_id = order["claim_id"]
            else:
                params["id"], claim_id = _claimed_order()
            if body is not None and _is_uuid(body.get("claim_id")):
                body["claim_id"] = claim_id
        if body is not None and _is_uuid(body.get("agent_id")):
            body["agent_id"] = AGENT_ID


@schemathesis.hook
def after_call(context, case, response):
    key = f"{case.method.upper()} {_op(case)}"
    with _lock:
        per_op = _counts.setdefault(key, {})
        status = str(response.status_code)
        per_op[status] = per_op.get(status, 0) + 1
        if COUNTS_FILE:
            tmp = COUNTS_FILE + ".tmp"
            with open(tmp, "w") as f:
                json.dump(_counts, f)
            os.replace(tmp, COUNTS_FILE)


@schemathesis.hook
def filter_failure(context, failure, case, response):
    """Keep every failure except use_after_free after `DELETE /agents/{id}`: docs/design.md §5 makes
    that a *retire* (token revoked, claims back to PENDING), and a retired agent stays readable
    (`GET /agents/{id}` is `200` with `health: retired`; rotating its token is
    `409 agent_retired`; its revoked token gets `401`). The check stays on for work orders,
    where a cancelled order is `404`, except for its attempts and output, which stay readable."""
    # A request line past 64 KiB is refused by the HTTP layer (hyper) with `414 URI Too Long`
    # before any route sees it, so neither the API's own 400 nor its documented statuses apply:
    # the fuzzer reaches it with long repeated query parameters (`GET /backlog?annotation=…`).
    if response is not None and response.status_code == 414:
        return False
    # A generated Idempotency-Key that repeats (`0`) with another body is `422
    # idempotency_key_reused` by design; before_call renews keys only in positive cases.
    if getattr(failure, "code", None) == "ST202" and response is not None and response.status_code == 422:
        try:
            if response.json()["error"]["code"] == "idempotency_key_reused":
                return False
        except Exception:
            pass
    # `disrupted: true` goes only with `success: false` (docs/design.md §12): complete refuses the
    # pair with `400 invalid_field` naming `disrupted` (a batch complete, `completes[i].disrupted`). The field's description says so; the schema
    # does not, because an `anyOf` for it stops generated clients (e2e/openapi/client.sh).
    if getattr(failure, "code", None) == "ST202" and response is not None and response.status_code == 400:
        try:
            error = response.json()["error"]
            if error["code"] == "invalid_field" and re.match(
                r"(completes\[\d+\]\.)?disrupted: ", error["message"]
            ):
                return False
        except Exception:
            pass
    if getattr(failure, "code", None) != "ST301":
        return True
    free = getattr(failure, "free", "")
    # A cancelled order keeps its history: its attempts stay readable (docs/design.md §5 serves the
    # attempts of active and finished orders), while the order itself is `404 finished`.
    # Its output too (docs/design.md §9: output of active and finished orders alike), read as finished.
    if re.fullmatch(r"DELETE /api/v1/work-orders/[0-9a-fA-F-]{36}", free):
        if _op(case) == "/work-orders/{id}/attempts" and response.status_code == 200:
            return False
        if _op(case) == "/work-orders/{id}/output" and response.status_code == 200:
            try:
                return response.json().get("finished") is not True
            except Exception:
                return True
        return True
    if not re.fullmatch(r"DELETE /api/v1/agents/[0-9a-fA-F-]{36}", free):
        return True
    try:
        data = response.json()
    except Exception:
        return True
    if response.status_code == 200 and isinstance(data, dict) and data.get("health") == "retired":
        return False
    # A retired agent's backlog stays readable, and is empty: it takes nothing any more.
    if _op(case) == "/agents/{id}/backlog" and response.status_code == 200 and data.get("count") == 0:
        return False
    code = (data.get("error") or {}).get("code") if isinstance(data, dict) else None
    return not (response.status_code == 409 and code == "agent_retired") and not (
        response.status_code == 401 and code == "unauthorized"
    )
