"""A typed agent on a kernel with bearer auth (PythonClient.test.ts).

The handler takes a Pydantic model (the input is validated and its schema
published), the output schema is a model class, the webhook is served on a
path of its own, and ``split`` runs the same agent as a subagent, whose
``Client`` is built from REBUNO_URL and REBUNO_API_KEY (an API key the test
made with the ``executions:write`` scope).
"""

import logging
import os

from pydantic import BaseModel

from counters import bump
from rebuno import Agent, subagent, tool

logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")


class Order(BaseModel):
    item: str
    qty: int = 1
    split: bool = False


class Receipt(BaseModel):
    item: str
    qty: int
    parts: list[dict]


@tool("pack")
async def pack(item: str, qty: int) -> dict:
    return {"item": item, "qty": qty, "packs": bump("pack")}


@tool("split")
async def split(item: str, qty: int) -> dict:
    return await subagent("typed", {"item": item, "qty": qty})


async def process(order: Order) -> dict:
    if order.split:
        part = await split(item=order.item, qty=order.qty)
        return {"item": order.item, "qty": order.qty, "parts": part["parts"]}
    packed = await pack(item=order.item, qty=order.qty)
    return {"item": order.item, "qty": order.qty, "parts": [packed]}


agent = Agent(
    "typed",
    description="Packs an order, or has a subagent pack it.",
    output_schema=Receipt,
    webhook_path="/hooks/typed",
)
agent.run(process, host="127.0.0.1", port=int(os.environ["AGENT_PORT"]))
