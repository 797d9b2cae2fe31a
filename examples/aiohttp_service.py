"""An aiohttp service that publishes one message per request.

    pip install aiohttp
    python examples/aiohttp_service.py
    PRODUCERKIT_URL=kafka://127.0.0.1:9092 python examples/aiohttp_service.py
    curl -X POST localhost:8080/orders -d '{"user": "user-1", "total": 42}'

One Producer serves the whole app: started with it, flushed and closed when it stops (Ctrl-C,
SIGTERM). A request waits for the broker's ack, then answers where the message was stored;
while the broker cannot take it (no ack within ``timeout``, no connection), the answer is 503,
so the client knows to try again. ``PORT`` sets the port (8080).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator

from aiohttp import web

import producerkit as pk

URL = os.environ.get("PRODUCERKIT_URL") or "memory://orders-service"
PRODUCER = web.AppKey("producer", pk.Producer)


async def producer_context(app: web.Application) -> AsyncIterator[None]:
    async with pk.Producer(URL, topic="orders", timeout=5) as producer:
        app[PRODUCER] = producer
        yield


async def post_order(request: web.Request) -> web.Response:
    body = await request.read()
    try:
        user = json.loads(body)["user"]
    except (ValueError, KeyError, TypeError):
        raise web.HTTPBadRequest(text='expected a JSON object with a "user"') from None
    try:
        delivery = await request.app[PRODUCER].produce(body, key=str(user))
    except (pk.ProduceTimeout, pk.BrokerUnavailable) as error:
        raise web.HTTPServiceUnavailable(text=str(error)) from error
    stored = {"topic": delivery.topic, "partition": delivery.partition, "offset": delivery.offset}
    return web.json_response(stored, status=201)


def make_app() -> web.Application:
    app = web.Application()
    app.cleanup_ctx.append(producer_context)
    app.router.add_post("/orders", post_order)
    return app


if __name__ == "__main__":
    web.run_app(make_app(), host="127.0.0.1", port=int(os.environ.get("PORT") or 8080))
