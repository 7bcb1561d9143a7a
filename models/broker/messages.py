"""The names of the messages the ingress, the CLI and the worker exchange.

They meet only through the broker, so the names live here, below all three.
Messages carry keys, never payloads or ORM objects.
"""

from collections.abc import Sequence

#: The live lane: what a sender is waiting for (models.broker.lanes).
DELIVERIES_QUEUE = "deliveries"
#: The background lane: floods, catch-ups, bulk replays and the sweeper's
#: resends (models.broker.lanes). The same messages as on the live lane; a
#: deliveries worker consumes both, in turn.
BACKGROUND_QUEUE = "deliveries.background"
#: Both lanes: the queues a deliveries worker consumes (the Procfile's ``--queues``).
DELIVERY_QUEUES = (DELIVERIES_QUEUE, BACKGROUND_QUEUE)
OPERATOR_QUEUE = "operator"

#: process_delivery(delivery_pk: int) on the deliveries queue.
PROCESS_DELIVERY = "taskhook.process_delivery"
#: process_deliveries(delivery_pks: list[int]) on the deliveries queue: several
#: keys the relay published together, each processed as PROCESS_DELIVERY would.
PROCESS_DELIVERIES = "taskhook.process_deliveries"
#: sweep() from beat, on the deliveries queue.
SWEEP = "taskhook.sweep"
#: catch_up() from beat, on the operator queue: every source with access to
#: its provider's API is caught up (worker.catchup). Not on the
#: deliveries queue: it waits on GitHub's API, and on its rate limits.
CATCH_UP = "taskhook.catch_up"
#: prune() from beat, on the operator queue: the inbox's retention policy
#: (worker.retention), in small batches. Not on the deliveries queue: a long
#: prune must not stand between a delivery and its worker.
PRUNE = "taskhook.prune"
#: release_identity(workspace_id, external_id, operator, reason, expected_task_id) on the
#: operator queue; a message without the expected holder is refused (worker.operator).
RELEASE_IDENTITY = "taskhook.release_identity"
#: The header of a RELEASE_IDENTITY message naming its Idempotency-Key: a
#: header, which a 0.1.0 worker passes over, where an unknown keyword would
#: fail it (docs/deploy.md, "Messages"). Its keyword ``idempotency_key`` is
#: taken from 0.2.0 on, to be sent from the release after.
IDEMPOTENCY_KEY_HEADER = "taskhook_idempotency_key"


def message_groups(keys: Sequence[int], per_message: int, spread: int = 1) -> list[list[int]]:
    """``keys`` in order, cut into groups of at most ``per_message``: one message each.

    With ``spread``, keys that would fill fewer than ``spread`` messages go in
    up to that many instead, one per two keys at most, as even as they can be:
    a worker runs its messages on parallel threads, so a delivery waits behind
    fewer earlier keys of its message. Many keys still fill their messages: a
    message costs the worker about a millisecond of its own.
    """
    # One message per two keys at most: a key waits for one other at worst,
    # and the worker's cost per message is still shared.
    count = min(-(-len(keys) // 2), spread)
    if count <= -(-len(keys) // per_message):  # enough messages already: fill each
        return [
            list(keys[start : start + per_message]) for start in range(0, len(keys), per_message)
        ]
    size, larger = divmod(len(keys), count)
    groups, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < larger else 0)
        groups.append(list(keys[start:end]))
        start = end
    return groups


def task_for(keys: Sequence[int]) -> tuple[str, list]:
    """The task and arguments of the message for ``keys``: a lone key goes as
    PROCESS_DELIVERY, as the sweeper sends it; several as PROCESS_DELIVERIES
    (the relay's bursts, a catch-up's batches)."""
    if len(keys) == 1:
        return PROCESS_DELIVERY, [int(keys[0])]
    return PROCESS_DELIVERIES, [[int(key) for key in keys]]
