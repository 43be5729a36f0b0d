"""Forks an execution with the SDK's ``Client.fork`` and prints the answer.

Reads SOURCE_ID and AT_SEQ (and optional FORK_SESSION, FORK_POLICY) from the
environment; prints ``{"forked": <the execution as the client parsed it>}``.
"""

import asyncio
import json
import os

from rebuno import Client


async def main() -> None:
    async with Client() as client:
        forked = await client.fork(
            os.environ["SOURCE_ID"],
            at_seq=int(os.environ["AT_SEQ"]),
            session=os.environ.get("FORK_SESSION", ""),
            policy_bundle=os.environ.get("FORK_POLICY", ""),
        )
        print(json.dumps({"forked": forked.model_dump(mode="json")}))


asyncio.run(main())
