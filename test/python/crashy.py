"""An agent the test kills mid-run (SIGKILL) and starts again.

``charge`` (``at_most_once``) runs and is recorded; then ``ship`` starts and,
when HANG_IN_SHIP=1, never returns: the test kills the process there. The
restarted process (without HANG_IN_SHIP) is redelivered the execution: the
recorded ``charge`` replays (its counter stays at 1) and ``ship`` runs again.
"""

import asyncio
import logging
import os

from counters import bump
from rebuno import Agent, tool

logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")


@tool("charge", idempotency="at_most_once")
async def charge(order: str, amount: int) -> dict:
    return {"order": order, "amount": amount, "charges": bump("charge")}


@tool
async def ship(order: str) -> dict:
    runs = bump("ship")
    if os.environ.get("HANG_IN_SHIP") == "1":
        await asyncio.sleep(3600)
    return {"order": order, "shipped": True, "runs": runs}


async def process(order: str, amount: int) -> dict:
    charged = await charge(order=order, amount=amount)
    shipped = await ship(order=order)
    return {"charged": charged, "shipped": shipped}


agent = Agent("crashy", description="Charges and ships an order.")
agent.run(process, host="127.0.0.1", port=int(os.environ["AGENT_PORT"]))
