"""The names of the messages the ingress, the CLI and the worker exchange.

They meet only through the broker, so the names live here, below all three.
Messages carry keys, never payloads or ORM objects.
"""

DELIVERIES_QUEUE = "deliveries"
OPERATOR_QUEUE = "operator"

#: process_delivery(delivery_pk: int) on the deliveries queue.
PROCESS_DELIVERY = "taskhook.process_delivery"
#: process_deliveries(delivery_pks: list[int]) on the deliveries queue: several
#: keys the relay published together, each processed as PROCESS_DELIVERY would.
PROCESS_DELIVERIES = "taskhook.process_deliveries"
#: sweep() from beat, on the deliveries queue.
SWEEP = "taskhook.sweep"
#: catch_up() from beat, on the operator queue: every source with access to
#: its provider's delivery log is caught up (worker.catchup). Not on the
#: deliveries queue: it waits on GitHub's API, and on its rate limits.
CATCH_UP = "taskhook.catch_up"
#: release_identity(workspace_id, external_id, operator, reason) on the operator queue.
RELEASE_IDENTITY = "taskhook.release_identity"
