"""The child agent of planner.py: one tool, ``lookup``."""

import logging
import os

from counters import bump
from rebuno import Agent, tool

logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")


@tool
async def lookup(topic: str) -> dict:
    return {"topic": topic, "facts": [f"{topic} is durable"], "lookups": bump("lookup")}


async def process(topic: str) -> dict:
    found = await lookup(topic=topic)
    return {"summary": f"{len(found['facts'])} fact about {topic}", "facts": found["facts"]}


agent = Agent("researcher", description="Looks a topic up.")
agent.run(process, host="127.0.0.1", port=int(os.environ["AGENT_PORT"]))
