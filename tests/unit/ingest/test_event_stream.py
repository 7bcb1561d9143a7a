"""The SSE stream's loop (``ingest.events._stream``) against a feed in
memory: what arrived since a stream's last write goes out as one write, in
order, from frames encoded once; a stream resumes after its cursor; it wakes
on a change and on its own timer."""

from __future__ import annotations

import asyncio
import contextlib

from ingest import events
from ingest.notifications import WorkspaceFeed


def frames(*positions: int) -> list[dict]:
    return events.framed(
        [
            {"id": n, "type": "task.created", "task_id": n, "workspace_id": 1, "occurred_at": "t"}
            for n in positions
        ]
    )


def live_feed(*positions: int) -> WorkspaceFeed:
    feed = WorkspaceFeed(1, keep=100)
    feed.live = True
    feed.start_at(0)
    feed.add(frames(*positions))
    return feed


async def unread(cursor: int) -> list[dict]:
    raise AssertionError(f"read the database after {cursor}: the feed could answer")


def stream(feed: WorkspaceFeed, cursor: int = 0, timeout: float = 30.0):
    return events._stream(
        unread, contextlib.nullcontext(feed), cursor, timeout=timeout, limit=100, poll_seconds=60
    )


def test_a_burst_goes_out_as_one_write_of_frames_encoded_once_in_order():
    async def scenario() -> None:
        feed = live_feed()
        streams = [stream(feed), stream(feed)]
        for body in streams:
            assert await anext(body) == b"retry: 1000\n\n"
        waiting = [asyncio.ensure_future(anext(body)) for body in streams]
        await asyncio.sleep(0.01)
        assert not any(write.done() for write in waiting)  # parked on the feed
        burst = frames(1, 2, 3, 4, 5)
        feed.add(burst[:2])
        feed.signal()
        feed.add(burst[2:])  # before the streams ran: they send all five at once
        feed.signal()
        expected = b"".join(event["frame"] for event in burst)
        assert await asyncio.gather(*waiting) == [expected, expected]
        for body in streams:
            await body.aclose()

    asyncio.run(scenario())


def test_a_stream_resumes_after_its_cursor_and_never_sends_an_event_twice():
    async def scenario() -> None:
        feed = live_feed(1, 2, 3, 4)
        body = stream(feed, cursor=2)
        assert await anext(body) == b"retry: 1000\n\n"
        first = await anext(body)
        assert first.startswith(b"id: 3\n") and b"id: 4\n" in first and b"id: 2\n" not in first
        feed.add(frames(5))
        feed.signal()
        assert (await anext(body)).startswith(b"id: 5\n")
        await body.aclose()

    asyncio.run(scenario())


def test_an_idle_stream_wakes_on_its_own_timer_to_close():
    async def scenario() -> None:
        feed = live_feed()
        body = stream(feed, timeout=0.2)
        assert await anext(body) == b"retry: 1000\n\n"
        async with asyncio.timeout(2):
            assert [chunk async for chunk in body] == []  # closed when its time came
        assert all(waiter.done() for waiter in feed._waiters)

    asyncio.run(scenario())
