"""The client side of the approval flow, through the SDK's ``Client`` only.

Creates a ``deployer`` execution, waits until it is blocked on an approval,
grants it as alice, waits for the end and prints one JSON report on stdout:
``{"created", "blocked", "approval", "pending_after", "final", "events"}``.
Every wait has a deadline (WAIT_SECONDS, default 20); on a timeout the script
exits 2 with the last state it saw on stderr (3 when the execution ends
without blocking).
"""

import asyncio
import json
import os
import sys
import time

from rebuno import Client

DEADLINE = float(os.environ.get("WAIT_SECONDS", "20"))


async def wait_for(what, probe):
    start = time.monotonic()
    last = None
    while time.monotonic() - start < DEADLINE:
        last = await probe()
        if last[0]:
            return last[1]
        await asyncio.sleep(0.1)
    print(f"timed out after {DEADLINE}s waiting for {what}; last seen: {last[1]!r}", file=sys.stderr)
    sys.exit(2)


async def main() -> None:
    async with Client() as client:
        created = await client.create("deployer", {"service": "billing"})

        async def blocked():
            ex = await client.get(created.id)
            if ex.status in ("completed", "failed", "cancelled"):
                print(f"the execution ended before blocking: {ex.model_dump_json()}", file=sys.stderr)
                sys.exit(3)
            return ex.status == "blocked", ex

        blocked_ex = await wait_for("the execution to block", blocked)

        async def pending_approval():
            mine = [a for a in await client.list_approvals() if a.execution_id == created.id]
            return len(mine) == 1, mine

        [approval] = await wait_for("one pending approval of the execution", pending_approval)
        approval = await client.get_approval(approval.id)
        await client.grant_approval(approval.id, decided_by="alice", rationale="tests passed")
        pending_after = [a for a in await client.list_approvals() if a.execution_id == created.id]

        async def finished():
            ex = await client.get(created.id)
            return ex.status in ("completed", "failed", "cancelled"), ex

        final = await wait_for("the execution to finish", finished)
        events = await client.events(created.id)
        print(
            json.dumps(
                {
                    "created": created.model_dump(mode="json"),
                    "blocked": blocked_ex.model_dump(mode="json"),
                    "approval": approval.model_dump(mode="json"),
                    "pending_after": [a.model_dump(mode="json") for a in pending_after],
                    "final": final.model_dump(mode="json"),
                    "events": [e.model_dump(mode="json") for e in events],
                }
            )
        )


asyncio.run(main())
