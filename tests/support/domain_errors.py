"""One instance of every domain error, for the tests of each surface's mapping
(tests/unit/test_errors.py, tests/integration/ingest/test_api_errors.py)."""

from __future__ import annotations

from models.errors import (
    DeliveryNotFound,
    DeliveryRefused,
    ExternalIdHasControlCharacter,
    ExternalIdNotText,
    ExternalIdTooLong,
    HolderChanged,
    IdentityRetired,
    InvalidExternalId,
    InvalidFilter,
    InvalidMerge,
    InvalidOperation,
    InvalidRelease,
    InvalidSource,
    InvalidTask,
    InvalidToken,
    InvalidWorkspace,
    LeaseTakenOver,
    MergeNotFound,
    MergeRefused,
    NotReplayable,
    OperationNotFound,
    RefusalKind,
    SourceNotFound,
    TaskNotFound,
    TaskStoreError,
    TokenNotFound,
    WipLimitReached,
    WorkspaceMisconfigured,
    WorkspaceNotAccessible,
)
from models.inbox import Lease

#: One instance of every domain error: a new class needs a line here, and so
#: goes through every surface's test below.
SAMPLES: dict[type[TaskStoreError], TaskStoreError] = {
    WorkspaceNotAccessible: WorkspaceNotAccessible(7),
    TaskNotFound: TaskNotFound(),
    DeliveryNotFound: DeliveryNotFound(3),
    SourceNotFound: SourceNotFound("acme-github"),
    TokenNotFound: TokenNotFound(9),
    OperationNotFound: OperationNotFound(4),
    MergeNotFound: MergeNotFound(5),
    InvalidTask: InvalidTask("title is required"),
    InvalidRelease: InvalidRelease("a release must give a reason"),
    InvalidSource: InvalidSource("a signing secret cannot be empty"),
    InvalidWorkspace: InvalidWorkspace("a workspace needs a name"),
    InvalidToken: InvalidToken("no token with id 9"),
    InvalidFilter: InvalidFilter("received_from must be before received_until"),
    InvalidOperation: InvalidOperation("a bulk replay needs a name"),
    InvalidMerge: InvalidMerge("a task cannot be merged into itself"),
    InvalidExternalId: InvalidExternalId("external_id is required"),
    DeliveryRefused: DeliveryRefused(RefusalKind.MALFORMED, "the delivery names no event"),
    ExternalIdHasControlCharacter: ExternalIdHasControlCharacter(1, 0x0A),
    ExternalIdTooLong: ExternalIdTooLong(300, 255),
    ExternalIdNotText: ExternalIdNotText("int"),
    WipLimitReached: WipLimitReached("Inbox", 2),
    HolderChanged: HolderChanged(1, 2, "ACME-2"),
    IdentityRetired: IdentityRetired("'jira:ACME-1' was deleted (task 4): ...", 4),
    MergeRefused: MergeRefused("merge 5 was undone already"),
    NotReplayable: NotReplayable("delivery 3 is done; only needs_operator or dead replay"),
    LeaseTakenOver: LeaseTakenOver(Lease(delivery_pk=3, attempt=1)),
    WorkspaceMisconfigured: WorkspaceMisconfigured("workspace 7 has no workflow steps"),
}
