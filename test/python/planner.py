"""A parent agent whose tool runs the ``researcher`` agent as a subagent.

``delegate`` calls ``subagent("researcher", …)``: the child is created bound
to the tool's step, the parent suspends, and when the child completes the
kernel settles the step with the child's output; the parent's handler reruns
and the step replays. The ``delegate`` counter shows how often the tool body
ran (the SDK's subagent client reads REBUNO_URL).
"""

import logging
import os

from counters import bump
from rebuno import Agent, subagent, tool

logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")


@tool
async def delegate(topic: str) -> dict:
    bump("delegate")
    return await subagent("researcher", {"topic": topic})


async def process(topic: str) -> dict:
    findings = await delegate(topic=topic)
    return {"topic": topic, "findings": findings}


agent = Agent("planner", description="Delegates research to a subagent.")
agent.run(process, host="127.0.0.1", port=int(os.environ["AGENT_PORT"]))
