"""What an API user writes with a client generated from the served OpenAPI document (issue #26).

Run by e2e/openapi/client.sh, which generates the package `pullman_client` with
openapi-python-client, checks this file and the package with `mypy --strict`, and runs it against
a real `pullman serve`. Uses only the generated types: an admin registers an agent and creates an
order (docs/design.md §5), the agent claims it by id and completes it, and the order is found in the
log as succeeded. Exits non-zero (AssertionError) on any answer other than the documented one.

Usage: python program.py BASE_URL ADMIN_TOKEN
"""

from __future__ import annotations

import sys
import uuid
from http import HTTPStatus

from pullman_client import AuthenticatedClient
from pullman_client.api.agents import register
from pullman_client.api.claims import claim, complete
from pullman_client.api.log import get_log, list_log
from pullman_client.api.work_orders import create, list_work_orders
from pullman_client.models import (
    AgentWithToken,
    ClaimBody,
    CompleteBody,
    ErrorBody,
    LogEntry,
    NewAgent,
    NewWorkOrder,
    Outcome,
    LogEntryPage,
    WorkOrderPage,
    Targeting,
    WorkOrder,
    WorkType,
)

YAML = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-generated-client\n"


def main(base_url: str, admin_token: str) -> None:
    admin = AuthenticatedClient(base_url=base_url, token=admin_token, raise_on_unexpected_status=True)
    label = f"generated-client-{uuid.uuid4().hex[:8]}"

    registered = register.sync(client=admin, body=NewAgent(name=label, labels=[label]))
    assert isinstance(registered, AgentWithToken), registered
    agent_id = registered.agent.id
    agent = AuthenticatedClient(base_url=base_url, token=registered.token, raise_on_unexpected_status=True)

    # Targeting with no criterion is refused at creation (docs/design.md §3), typed as ErrorBody.
    empty = create.sync_detailed(
        client=admin, body=NewWorkOrder(work_type=WorkType.CUSTOM, yaml_content=YAML, targeting=Targeting())
    )
    assert empty.status_code == HTTPStatus.BAD_REQUEST, empty
    assert isinstance(empty.parsed, ErrorBody) and empty.parsed.error.code == "invalid_field", empty.parsed

    # Create, then create again with the same Idempotency-Key: the same order, marked replayed.
    body = NewWorkOrder(work_type=WorkType.CUSTOM, yaml_content=YAML, targeting=Targeting(labels=[label]))
    key = str(uuid.uuid4())
    first = create.sync_detailed(client=admin, body=body, idempotency_key=key)
    assert first.status_code == HTTPStatus.CREATED and isinstance(first.parsed, WorkOrder), first
    order: WorkOrder = first.parsed
    assert "Idempotent-Replayed" not in first.headers
    again = create.sync_detailed(client=admin, body=body, idempotency_key=key)
    assert isinstance(again.parsed, WorkOrder) and again.parsed.id == order.id, again
    assert again.headers.get("Idempotent-Replayed") == "true", again.headers
    assert order.tenant is None and order.claim_id is None  # always sent, as null

    # Page items are WorkOrder, not an inline copy.
    page = list_work_orders.sync(client=admin, label=label)
    assert isinstance(page, WorkOrderPage), page
    assert [o.id for o in page.items] == [order.id] and isinstance(page.items[0], WorkOrder)

    claimed = claim.sync(order.id, client=agent, body=ClaimBody(agent_id=agent_id, lease_seconds=60))
    assert isinstance(claimed, WorkOrder) and claimed.claimed_by == agent_id, claimed
    assert claimed.claim_id is not None and claimed.yaml_content == YAML

    done = complete.sync(
        order.id,
        client=agent,
        body=CompleteBody(agent_id=agent_id, claim_id=claimed.claim_id, success=True, message="done"),
    )
    assert isinstance(done, LogEntry) and done.outcome == Outcome.SUCCEEDED, done

    entry = get_log.sync(order.id, client=admin)
    assert isinstance(entry, LogEntry), entry
    assert entry.outcome == Outcome.SUCCEEDED and entry.success and entry.message == "done", entry
    log = list_log.sync(client=admin, label=label)
    assert isinstance(log, LogEntryPage), log
    assert [(e.id, e.outcome) for e in log.items] == [(order.id, Outcome.SUCCEEDED)], log.items
    print(f"order {order.id}: created, claimed by {agent_id}, completed; in the log as {entry.outcome.value}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
