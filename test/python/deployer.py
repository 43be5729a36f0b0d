"""A deploy agent whose production deploy needs a human (approve.py grants it).

The test's policy allows ``run_tests`` and requires an approval for
``deploy`` to production. ``deploy`` is ``at_most_once`` and bumps the
``deploy`` counter each time its body runs.
"""

import logging
import os

from counters import bump
from rebuno import Agent, tool

logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")


@tool
async def run_tests(service: str) -> dict:
    return {"service": service, "passed": True}


@tool("deploy", idempotency="at_most_once")
async def deploy(service: str, environment: str) -> dict:
    return {"service": service, "environment": environment, "deploys": bump("deploy")}


async def process(service: str) -> dict:
    tests = await run_tests(service=service)
    deployed = await deploy(service=service, environment="production")
    return {"tests": tests, "deployed": deployed}


agent = Agent("deployer", description="Tests and deploys a service.")
agent.run(process, host="127.0.0.1", port=int(os.environ["AGENT_PORT"]))
