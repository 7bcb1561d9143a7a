"""The ingress with one more route that fails unexpectedly, for the catch-all test
(``uvicorn tests.reliability.failing_app:app``). Everything else is the real app."""

from __future__ import annotations

from ingest.app import create_app

app = create_app()


@app.get("/_reliability/unexpected-error", include_in_schema=False)
async def unexpected_error() -> None:
    raise RuntimeError("a bug, on purpose")
