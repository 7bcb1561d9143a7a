"""The two receivers taskhook's ingress is measured against, in the same run.

- :func:`tutorial_app`: what the tutorials show -- a FastAPI route that checks
  the HMAC and calls Celery ``.delay(body)``; it stores nothing, so a broker
  outage loses the delivery.
- :func:`durable_app`: the least a durable receiver can do -- the HMAC check,
  one INSERT ... ON CONFLICT DO NOTHING (asyncpg) and one Redis LPUSH.

Both are ``uvicorn --factory`` targets, configured from ``BENCH_*`` variables,
and run under the same uvicorn options as taskhook's ingress.
"""

from __future__ import annotations

import hashlib
import hmac
import os

from fastapi import FastAPI, HTTPException, Request

#: The header that carries the signature, by provider (both are sha256=<hex>).
SIGNATURE_HEADERS = {"github": "x-hub-signature-256", "jira": "x-hub-signature"}
DELIVERY_HEADERS = {"github": "x-github-delivery", "jira": "x-atlassian-webhook-identifier"}

DURABLE_TABLE = """
CREATE TABLE IF NOT EXISTS bench_inbox (
    id bigserial PRIMARY KEY,
    delivery_id text NOT NULL UNIQUE,
    body bytea NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
)
"""


def _verified(provider: str, body: bytes, request: Request, secret: bytes) -> None:
    expected = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
    given = request.headers.get(SIGNATURE_HEADERS.get(provider, ""), "")
    if not hmac.compare_digest(expected, given):
        raise HTTPException(status_code=401, detail="bad signature")


def tutorial_app() -> FastAPI:
    from celery import Celery

    secret = os.environ["BENCH_SECRET"].encode()
    celery = Celery("bench-tutorial", broker=os.environ["BENCH_BROKER_URL"])
    celery.conf.update(task_serializer="json", accept_content=["json"], task_ignore_result=True)

    @celery.task(name="bench.tutorial.handle_webhook")
    def handle_webhook(body: str) -> None:  # never run: no worker consumes this queue
        del body

    app = FastAPI()

    @app.post("/webhooks/{provider}/{source}", status_code=202)
    async def receive(provider: str, source: str, request: Request) -> dict[str, str]:
        body = await request.body()
        _verified(provider, body, request, secret)
        handle_webhook.delay(body.decode())
        return {"status": "queued"}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def durable_app() -> FastAPI:
    from contextlib import asynccontextmanager

    import asyncpg
    import redis.asyncio as aioredis

    secret = os.environ["BENCH_SECRET"].encode()
    state: dict = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state["db"] = await asyncpg.create_pool(os.environ["BENCH_DSN"], min_size=4, max_size=10)
        state["redis"] = aioredis.Redis(
            connection_pool=aioredis.BlockingConnectionPool.from_url(
                os.environ["BENCH_BROKER_URL"], max_connections=20, timeout=2
            )
        )
        yield
        await state["db"].close()
        await state["redis"].aclose()

    app = FastAPI(lifespan=lifespan)

    @app.post("/webhooks/{provider}/{source}", status_code=202)
    async def receive(provider: str, source: str, request: Request) -> dict[str, object]:
        body = await request.body()
        _verified(provider, body, request, secret)
        delivery_id = request.headers.get(DELIVERY_HEADERS.get(provider, ""))
        if not delivery_id:
            raise HTTPException(status_code=400, detail="no delivery id")
        pk = await state["db"].fetchval(
            "INSERT INTO bench_inbox (delivery_id, body) VALUES ($1, $2) "
            "ON CONFLICT (delivery_id) DO NOTHING RETURNING id",
            f"{source}:{delivery_id}",
            body,
        )
        if pk is None:
            return {"status": "duplicate"}
        await state["redis"].lpush("bench:inbox", pk)
        return {"delivery": pk, "status": "queued"}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
