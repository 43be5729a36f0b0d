"""A session agent: each execution reads the state the previous execution of
its session completed with (``previous()``) and returns new state with
``Result(output, state)``.
"""

import logging
import os

from rebuno import Agent, Result, previous

logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")


async def process(message: str) -> Result:
    prior = await previous()
    messages = (prior or {}).get("messages", []) + [message]
    return Result(
        output={"turn": len(messages), "previous": prior},
        state={"messages": messages},
    )


agent = Agent("chat", description="Remembers the conversation of its session.")
agent.run(process, host="127.0.0.1", port=int(os.environ["AGENT_PORT"]))
