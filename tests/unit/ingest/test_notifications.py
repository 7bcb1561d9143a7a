"""The listener's fan-out, without a database: a notification makes a
workspace's feed read once and wakes every stream that follows it; the feed
answers from memory only what it is sure of."""

from __future__ import annotations

import asyncio

from ingest.notifications import EventListener, WorkspaceFeed


def body(position: int) -> dict:
    return {"id": position, "type": "task.created"}


class FakeStore:
    """Each workspace's events, and every read the listener made."""

    def __init__(self) -> None:
        self.events: dict[int, list[dict]] = {}
        self.reads: list[tuple[int, int]] = []
        #: A read waits for this before it answers.
        self.gate = asyncio.Event()
        self.gate.set()

    def append(self, workspace: int) -> None:
        stream = self.events.setdefault(workspace, [])
        stream.append(body(len(stream) + 1))

    async def read(self, workspace: int, after: int, limit: int) -> list[dict]:
        self.reads.append((workspace, after))
        found = [e for e in self.events.get(workspace, []) if e["id"] > after][:limit]
        await self.gate.wait()  # what it found stands, whatever commits meanwhile
        return found

    async def last_position(self, workspace: int) -> int:
        return len(self.events.get(workspace, []))


def listening(store: FakeStore, **options) -> EventListener:
    """A listener whose connection is up, as far as the feeds can tell."""
    listener = EventListener(
        "unused", read=store.read, last_position=store.last_position, **options
    )
    listener.listening = True
    return listener


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def test_a_notification_reads_once_and_wakes_every_follower_of_its_workspace_only():
    async def scenario() -> None:
        store = FakeStore()
        store.append(1)  # before anyone followed: not the feed's to hold
        listener = listening(store)
        with listener.follow(1) as one, listener.follow(1) as two, listener.follow(2) as other:
            assert one is two and one is not other
            await settle()
            assert (one.head, other.head) == (1, 0)
            woken = [one.changed, other.changed]
            store.append(1)
            listener._notified("1")
            listener._notified("1")  # before the read began: that one read covers both
            store.gate.clear()
            await settle()
            assert store.reads == [(1, 1)]
            store.append(1)
            listener._notified("1")  # during the read: read once more after it
            store.gate.set()
            await settle()
            assert woken[0].is_set() and not woken[1].is_set()
            assert store.reads == [(1, 1), (1, 2)]
            assert one.after(1, 10) == [body(2), body(3)]
            assert one.after(2, 1) == [body(3)]
            assert one.after(3, 10) == []
            assert one.after(0, 10) is None  # from before the feed: the database's
        assert listener.feed(1) is None and listener.feed(2) is None

    asyncio.run(scenario())


def test_notifications_for_unfollowed_workspaces_or_garbage_do_nothing():
    async def scenario() -> None:
        store = FakeStore()
        listener = listening(store)
        listener._notified("7")
        listener._notified("not-a-number")
        await settle()
        assert store.reads == []

    asyncio.run(scenario())


def test_a_feed_keeps_its_latest_events_and_knows_where_its_memory_starts():
    feed = WorkspaceFeed(1, keep=3)
    feed.live = True
    feed.start_at(0)
    feed.add([body(n) for n in range(1, 7)])  # up to twice ``keep``: all kept
    assert (feed.covered_from, feed.after(0, 10)) == (0, [body(n) for n in range(1, 7)])
    feed.add([body(7)])  # past it: trimmed to the last 3
    assert (feed.covered_from, feed.head) == (4, 7)
    assert feed.after(3, 10) is None
    assert feed.after(4, 10) == [body(5), body(6), body(7)]
    assert feed.after(7, 10) == []
    feed.live = False  # the listener is down: nothing from memory
    assert feed.after(4, 10) is None


def test_a_signal_wakes_the_waiters_of_then_and_arms_a_fresh_one():
    async def scenario() -> None:
        feed = WorkspaceFeed(1, keep=10)
        before = feed.changed
        waiter = asyncio.ensure_future(before.wait())
        feed.signal()
        await asyncio.wait_for(waiter, 1)
        assert not feed.changed.is_set() and feed.changed is not before

    asyncio.run(scenario())


def test_going_down_wakes_every_feed_and_stops_answering_from_memory():
    async def scenario() -> None:
        store = FakeStore()
        listener = listening(store)
        with listener.follow(1) as feed:
            await settle()
            assert feed.after(0, 10) == []
            waiting = feed.changed
            listener._went_down()
            assert waiting.is_set() and not listener.listening
            assert feed.after(0, 10) is None

    asyncio.run(scenario())


def test_a_failed_read_leaves_the_feed_to_relearn_its_position():
    async def scenario() -> None:
        store = FakeStore()
        listener = listening(store)

        async def broken(*args) -> list[dict]:
            raise RuntimeError("the database went away")

        with listener.follow(1) as feed:
            await settle()
            listener._read = broken
            waiting = feed.changed
            listener._notified("1")
            await settle()
            assert waiting.is_set() and feed.head is None and feed.after(0, 10) is None

    asyncio.run(scenario())


def test_a_notification_whose_events_an_earlier_read_got_wakes_no_stream_again():
    async def scenario() -> None:
        store = FakeStore()
        listener = listening(store)
        with listener.follow(1) as feed:
            await settle()
            store.append(1)
            store.append(1)
            store.gate.clear()
            listener._notified("1")
            await settle()
            listener._notified("1")  # the second commit's, during the read that gets both
            waiter = feed.waiter()
            version = feed.version
            store.gate.set()
            await settle()
            assert waiter.done() and feed.version == version + 1  # one wake for both
            assert store.reads == [(1, 0), (1, 2)]  # the second read found nothing new
            assert feed.after(0, 10) == [body(1), body(2)]

    asyncio.run(scenario())
