"""What the JetStream examples share: Spark's Python set to this interpreter, and a count of the
messages a stream holds (read with a plain nats-py client, not producerkit)."""

from __future__ import annotations

import os
import sys

import nats

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


async def stream_messages(url: str, subject: str) -> int:
    nc = await nats.connect(url.replace("jetstream://", "nats://"))
    try:
        js = nc.jetstream()
        info = await js.stream_info(await js.find_stream_name_by_subject(subject))
        return int(info.state.messages)
    finally:
        await nc.close()
