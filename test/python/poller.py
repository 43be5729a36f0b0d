"""An agent that calls a rate-limited tool twice in a row.

The test's policy allows ``ping`` once per window and lets a step wait
(``max_wait``): the second call parks the execution, which is redelivered
after the wait; the first call replays and the second runs. The ``ping``
counter shows each call's body ran once.
"""

import logging
import os
import time

from counters import bump
from rebuno import Agent, tool

logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")


@tool
async def ping(n: int) -> dict:
    return {"n": n, "at": time.time(), "pings": bump("ping")}


async def process(count: int) -> dict:
    pings = [await ping(n=i) for i in range(count)]
    return {"pings": pings}


agent = Agent("poller", description="Pings a rate-limited service.")
agent.run(process, host="127.0.0.1", port=int(os.environ["AGENT_PORT"]))
