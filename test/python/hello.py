"""The hello agent of examples/hello.ts, written with the official Python SDK.

Two tools, ``reverse`` and ``word_count``; ``{"query"}`` in,
``{"query", "reversed", "word_count"}`` out. The SDK reads REBUNO_URL and
REBUNO_AGENT_SECRET; the webhook listens on AGENT_PORT.
"""

import logging
import os

from rebuno import Agent, tool

logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")


@tool
async def reverse(text: str) -> dict:
    return {"reversed": text[::-1]}


@tool("word_count")
async def word_count(text: str) -> dict:
    return {"count": len(text.split())}


async def process(query: str) -> dict:
    reversed_ = await reverse(text=query)
    counted = await word_count(text=query)
    return {"query": query, "reversed": reversed_["reversed"], "word_count": counted["count"]}


agent = Agent(
    "hello",
    description="Reverses a query and counts its words.",
    output_schema={
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "reversed": {"type": "string"},
            "word_count": {"type": "integer"},
        },
        "required": ["query", "reversed", "word_count"],
    },
)
agent.run(process, host="127.0.0.1", port=int(os.environ["AGENT_PORT"]))
