"""The provider contract: what the ingress, the worker and the CLI ask of a provider.

Everything provider-specific lives behind :class:`Provider`; nothing outside
``models/providers/`` names GitHub, Jira or GitLab to decide what to do. A
provider is one object (``models.providers.github.GITHUB``, ...) registered
once in ``models.providers.PROVIDERS``.

A provider class subclasses :class:`Provider` explicitly, so it inherits the
members with a default below (``verify``, ``action_of``, ``hook_id``,
``sent_at``, ``with_sent_at``) and implements only what its provider needs; a
type checker checks the rest of its signatures against this protocol.

Besides reading deliveries, a provider knows how to dress one
(:meth:`Provider.sample_headers`): the demo, the benchmarks and the tests send
samples built that one way, so each provider's headers are written down once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from models.names import Move
from models.providers.drafts import TaskDraft


class Verifier(Protocol):
    """The proof of one delivery's sender, checked while its body streams in."""

    def update(self, chunk: bytes) -> None:
        """Feed the next chunk of the raw body, as it arrives."""
        ...

    def matches(self) -> bool:
        """True when the whole body fed so far is proven to come from a holder
        of one of the active secrets."""
        ...


class Provider(Protocol):
    """One webhook provider: how its deliveries are verified, named, read and set up."""

    #: The name in URLs (``/webhooks/<name>/{source}``), sources and metrics.
    name: str
    #: The provider's name for people (``GitHub``), in the CLI and the API document.
    label: str
    #: The header the delivery id comes from, named in the 400 when it is missing.
    delivery_header: str
    #: The header that names the event, or None when the body alone names it.
    event_header: str | None
    #: The provider's headers kept with a stored delivery, lower-case, besides
    #: ``content-type`` and ``user-agent``: never a signature, token or secret.
    kept_headers: tuple[str, ...]
    #: The events a new source creates tasks from unless told otherwise.
    default_create_events: frozenset[str]
    #: Every event :meth:`to_draft` accepts: what ``--events`` may name.
    handled_events: frozenset[str]
    #: Events the provider sends that are known never to become tasks. A
    #: delivery of an event in neither set is stored as ignored too, but as
    #: an *unknown* event, counted apart (``models.providers.UNKNOWN_EVENT``).
    ignored_events: frozenset[str]
    #: The events that may announce a move (:meth:`moves`): stored for the
    #: worker when one does, though they create nothing (docs/contract.md §15).
    move_events: frozenset[str]
    #: Whether a source takes a site (``--site``): the base URL its links point at.
    takes_site: bool
    #: Where a person pastes a generated secret, e.g. "GitHub's webhook “Secret” field".
    secret_help: str
    #: How to set the webhook up at the provider, one line each, for the CLI.
    setup_help: tuple[str, ...]
    #: How a delivery is authenticated, for the API document.
    route_summary: str

    def verifier(self, headers: Mapping[str, str], secrets: Iterable[str]) -> Verifier:
        """A :class:`Verifier` of the delivery these ``headers`` came with,
        under each of the source's active ``secrets``."""
        ...

    def delivery_id(self, headers: Mapping[str, str], body: bytes) -> str | None:
        """The delivery's own id, the same on a redelivery (so it deduplicates);
        None when the delivery names none."""
        ...

    def decode_body(self, content_type: str | None, body: bytes) -> dict[str, Any]:
        """The JSON object of a delivery. Raises
        :class:`~models.providers.drafts.UnsupportedContentType` for a content
        type the provider never sends, and
        :class:`~models.providers.drafts.UnsupportedPayload` for a body that is
        not a JSON object."""
        ...

    def event_of(self, headers: Mapping[str, str], payload: dict[str, Any]) -> str | None:
        """The event's name as sources list it (``issues.opened``); None when
        the delivery names none."""
        ...

    def to_draft(
        self, event: str, payload: dict[str, Any], *, site: str | None = None
    ) -> TaskDraft:
        """The task a delivery of a handled ``event`` describes; ``site`` is the
        source's configured site, if any. The draft names the item's stable
        key where the provider has one, and the names a create says the item
        had (docs/contract.md §15, "Stable keys"). Raises
        :class:`~models.providers.drafts.UnsupportedPayload` for an event not in
        :attr:`handled_events` or a payload that lacks what the draft needs."""
        ...

    def moves(
        self, event: str, payload: dict[str, Any], site: str | None = None
    ) -> tuple[Move, ...]:
        """The moves a delivery of ``event`` announces (models/names.py):
        an item transferred, renamed or moved to another project, known by the
        names it had and has. ``()`` for an event not in :attr:`move_events`
        and for one that announces none (most updates). ``site`` is the
        source's configured site, if any. Raises
        :class:`~models.providers.drafts.UnsupportedPayload` for a payload that
        announces a move it does not say enough about."""
        ...

    def sample_headers(
        self,
        body: bytes,
        secret: str,
        *,
        event: str | None = None,
        delivery_id: str | None = None,
    ) -> dict[str, str]:
        """The headers the provider sends with ``body``, proven with ``secret``
        (signed, or the token itself): how the demo, the benchmarks and the
        tests dress a sample delivery. The ingress never calls it.

        ``event`` is the event ``body`` is a delivery of, as :meth:`event_of`
        names it (``issues.opened``): a provider that names events in a header
        sends its part there (``issues``; the action is the body's), and one
        whose body alone names the event ignores it. ``delivery_id`` is what
        :meth:`delivery_id` reads back; None for a fresh one, shaped like the
        provider's own.
        """
        ...

    # --- members with a default ----------------------------------------------------------

    def verify(self, body: bytes, headers: Mapping[str, str], secrets: Iterable[str]) -> bool:
        """:meth:`verifier` fed the whole ``body`` at once."""
        verifier = self.verifier(headers, secrets)
        verifier.update(body)
        return verifier.matches()

    def action_of(self, payload: dict[str, Any]) -> str | None:
        """The body's action, kept on the inbox row for people to read; None
        when the provider's bodies have none."""
        return None

    def hook_id(self, headers: Mapping[str, str]) -> str | None:
        """Which configured webhook sent the delivery; None when the provider
        does not say."""
        return None

    def sent_at(self, payload: dict[str, Any]) -> float | None:
        """When the delivery was sent, as a Unix time, if the body says so: the
        ingress refuses a body older than any retry of its sender
        (``TASKHOOK_MAX_DELIVERY_AGE_SECONDS``). None when it does not say."""
        return None

    def with_sent_at(self, body: bytes, sent_at: float) -> bytes:
        """A sample ``body`` as if sent at ``sent_at`` (a Unix time), so that
        :meth:`sent_at` reads it back and the ingress takes a recorded body as
        fresh; ``body`` as it is when the provider's bodies do not say."""
        return body
