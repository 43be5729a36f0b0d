"""An agent for forks: ``fetch`` a topic, then ``publish`` a summary.

Each tool bumps its side-effect counter when its body really runs, so the
test sees which steps a fork replayed and which it ran live. When a policy
denies ``publish`` (a fork's own bundle), the SDK's tool wrapper returns the
denial as text (the way a model would see it), and that text is the output's
``published``.
"""

import logging
import os

from counters import bump
from rebuno import Agent, tool

logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")


@tool("fetch")
async def fetch(topic: str) -> dict:
    return {"topic": topic, "facts": [f"{topic} is durable"], "fetches": bump("fetch")}


@tool("publish", idempotency="at_most_once")
async def publish(summary: str) -> dict:
    return {"summary": summary, "publishes": bump("publish")}


async def process(topic: str) -> dict:
    fetched = await fetch(topic=topic)
    published = await publish(summary="; ".join(fetched["facts"]))
    return {"fetched": fetched, "published": published}


agent = Agent("pipeline", description="Fetches a topic and publishes a summary.")
agent.run(process, host="127.0.0.1", port=int(os.environ["AGENT_PORT"]))
