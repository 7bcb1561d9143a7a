"""The load generator's open loop against a real HTTP server of its own."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

from aiohttp import web

from bench import taskhook
from bench.loadgen import Run


def _open_run(stop: Path, **options: Any) -> dict[str, Any]:
    """An open run at 200/s for up to 5 s against a server answering 202,
    told to stop once ``stop`` exists."""

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"status": "queued"}, status=202)

    async def main() -> dict[str, Any]:
        app = web.Application()
        app.router.add_post("/webhooks/{provider}/{source}", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        try:
            spec = {
                "url": f"http://127.0.0.1:{port}",
                "secret": taskhook.SECRET,
                "sources": taskhook.SOURCES,
                "tag": "loadgen-test",
                "mode": "open",
                "rate": 200,
                "duration": 5,
                "stop_when_exists": str(stop),
                **options,
            }
            return await Run(spec).run()
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def test_a_load_told_to_stop_before_it_began_still_sends_its_least(tmp_path: Path) -> None:
    # The other load ended while this one's process was still starting.
    stop = tmp_path / "stop"
    stop.touch()
    result = _open_run(stop, least_before_stop=20)
    assert result["sent"] == result["completed"] == 20, result
    assert result["elapsed_s"] < 4, result


def test_a_load_told_nothing_sends_one_request_before_heeding_the_stop(tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    stop.touch()
    result = _open_run(stop)
    assert result["sent"] == result["completed"] == 1, result
