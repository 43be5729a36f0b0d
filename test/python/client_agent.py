"""One agent for the SDK surface the other flows leave out (PythonClient.test.ts).

The input's ``mode`` picks what the handler does; what the handler saw (values,
exceptions by class) goes into the output or, for runs the kernel cuts short,
into ``COUNTER_DIR/seen-<execution id>.jsonl`` (one JSON object a line).

- ``basics``: the execution context, ``previous()`` without a session,
  ``step()`` (plain, with args, ``at_most_once``), ``@tool`` (ok, raising,
  concurrent), ``wrap_tool``, ``wrap_mcp_tool``/``wrap_mcp_tools``, LLM calls
  through ``http_client()`` (plain, streamed, refused by policy and turned back
  with ``raise_for_refusal``), ``Result`` with state.
- ``stream``: one streamed LLM call (the test follows its deltas).
- ``gate``: ``deploy`` needs an approval; after a denial the ``@tool`` wrapper
  answers the refusal as text and ``invoke_tool`` raises ``PolicyError``.
- ``expire``: ``deploy_fast`` needs an approval that expires (``PolicyError``).
- ``hang``: a tool that waits for ``release-<id>`` in COUNTER_DIR (cancel of a
  running execution), then one more tool call.
- ``park``: ``ping`` twice under a rate limit with ``max_wait`` (cancel while parked).
- ``many``: ``count`` local steps (long lists).
- ``prev``: ``previous()`` (with a parent given at create).
- ``delegate``: ``subagent()`` of this same agent from a tool: ``child`` when
  given, else one that completes (in ``session``) and one that fails.
- ``budget``: two LLM calls under a token budget; the refusal fails the run.
- ``fail_agent`` / ``fail_tool`` / ``fail_policy`` / ``fail_rate``: the failure
  reasons the SDK reports.

LLM_URL is the base URL of an OpenAI-compatible server (``…/v1``).
"""

import asyncio
import json
import logging
import os
from pathlib import Path

from counters import bump
from rebuno import (
    Agent,
    PolicyError,
    RateLimited,
    Result,
    ToolError,
    execution,
    failure_reason,
    http_client,
    previous,
    raise_for_refusal,
    step,
    subagent,
    tool,
    wrap_tool,
)
from rebuno.mcp import wrap_mcp_tool, wrap_mcp_tools

logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")

COUNTER_DIR = Path(os.environ["COUNTER_DIR"])


def seen(entry: dict) -> None:
    """Appends what the run saw to its ``seen-<id>.jsonl`` (read by the test)."""
    path = COUNTER_DIR / f"seen-{execution().id}.jsonl"
    with path.open("a") as f:
        f.write(json.dumps(entry) + "\n")


def llm_url() -> str:
    return os.environ["LLM_URL"].rstrip("/") + "/chat/completions"


@tool
async def echo(text: str) -> dict:
    return {"text": text, "echoes": bump("echo")}


@tool("explode")
async def explode(why: str) -> dict:
    bump("explode")
    raise ValueError(why)


@tool("deploy", idempotency="at_most_once")
async def deploy(service: str) -> dict:
    return {"service": service, "deploys": bump("deploy")}


@tool("slow")
async def slow(n: int) -> dict:
    """Waits until the test writes ``release-<execution id>`` (or forever)."""
    bump("slow")
    release = COUNTER_DIR / f"release-{execution().id}"
    try:
        while not release.exists():
            await asyncio.sleep(0.02)
    except BaseException as e:  # the SDK cancels the run when the kernel retires its lease
        seen({"where": "slow", "exception": type(e).__name__})
        raise
    seen({"where": "slow", "returned": n})
    return {"n": n}


@tool("deploy_fast")
async def deploy_fast(service: str) -> dict:
    return {"service": service}


@tool("delegate")
async def delegate(child: dict, session: str = "") -> dict:
    return await subagent(execution().agent_id, child, session=session)


@tool
async def ping(n: int) -> dict:
    return {"n": n, "pings": bump("ping")}


@tool("limited")
async def limited(n: int) -> dict:
    return {"n": n}


class Block:
    """A stand-in for an MCP content block (read as attributes, as the SDK does)."""

    def __init__(self, kind: str, text: str):
        self.type = kind
        self.text = text

    def __str__(self) -> str:
        return f"<{self.type}>"


class CallResult:
    def __init__(self, content=None, structuredContent=None):
        self.content = content
        self.structuredContent = structuredContent


async def mcp_call(name: str, args: dict):
    bump(f"mcp_{name}")
    if name == "search":
        return CallResult(structuredContent={"hits": [args["query"]], "args": args})
    if name == "read":
        return CallResult(content=[Block("text", f"page {args['page']}"), Block("image", "")])
    return {"raw": name}


async def basics(data: dict) -> Result:
    ctx = execution()
    out: dict = {
        "context": {
            "id": ctx.id,
            "agent_id": ctx.agent_id,
            "input": ctx.input,
            "status": ctx.status,
            "dispatch_id": ctx.dispatch_id,
            "dispatch_attempt": ctx.dispatch_attempt,
        },
        "previous": await previous(),
    }
    out["clock"] = await step("clock", lambda: 1700000000.5)
    out["sum"] = await step("add", lambda a, b: a + b, args={"a": 2, "b": 3})
    out["minted"] = await step("mint", lambda: f"id-{bump('mint')}", idempotency="at_most_once")
    out["echo"] = await echo(text="héllo <&> \u2028 🙂")
    try:
        await explode(why="kaboom")
        out["explode"] = None
    except ToolError as e:
        out["explode"] = {
            "class": type(e).__name__,
            "str": str(e),
            "tool_id": e.tool_id,
            "step_id": e.step_id,
            "failure_reason": failure_reason(e),
        }
    a, b = await asyncio.gather(echo(text="left"), echo(text="right"))
    out["concurrent"] = [a["text"], b["text"]]

    kv_get = wrap_tool(
        "kv_get",
        lambda args: {"key": args["key"], "value": 42},
        description="Reads a key.",
        args_schema={"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        to_result=lambda raw: {**raw, "wrapped": True},
    )
    out["kv"] = await kv_get(key="answer")
    search = wrap_mcp_tool(
        {
            "name": "search",
            "description": "Searches the docs.",
            "inputSchema": {"type": "object", "properties": {"query": {}, "limit": {}}},
        },
        call=mcp_call,
        prefix="docs",
    )
    out["mcp_search"] = await search(query="rebuno", limit=None)
    [read] = wrap_mcp_tools(
        [{"name": "read", "description": "", "input_schema": {"properties": {"page": {}}}}], call=mcp_call
    )
    out["mcp_read"] = await read(page=3)
    out["forbidden"] = await wrap_tool("forbidden", lambda args: "never")()

    async with http_client(timeout=30) as llm:
        plain = await llm.post(llm_url(), json={"model": "fake-1", "messages": [{"role": "user", "content": "hi"}]})
        out["llm_plain"] = {"status": plain.status_code, "body": plain.json()}
        async with llm.stream(
            "POST", llm_url(), json={"model": "fake-1", "stream": True, "messages": [{"role": "user", "content": "go"}]}
        ) as resp:
            out["llm_stream"] = {
                "status": resp.status_code,
                "content_type": resp.headers.get("content-type"),
                "text": "".join([chunk async for chunk in resp.aiter_text()]),
            }
        refused = await llm.post(llm_url(), json={"model": "forbidden-model", "messages": []})
        entry: dict = {"status": refused.status_code, "body": refused.json()}
        try:
            raise_for_refusal(RuntimeError(refused.text))
            entry["raised"] = None
        except PolicyError as e:
            entry["raised"] = {"class": type(e).__name__, "message": Exception.__str__(e)}
        out["llm_refused"] = entry
    return Result(output=out, state={"turns": 1, "mode": "basics"})


async def stream_only(data: dict) -> dict:
    async with http_client(timeout=60) as llm:
        async with llm.stream(
            "POST", llm_url(), json={"model": data.get("model", "fake-stream"), "stream": True, "messages": []}
        ) as resp:
            text = "".join([chunk async for chunk in resp.aiter_text()])
    return {"text": text}


async def gate(data: dict) -> dict:
    ctx = execution()
    as_tool = await deploy(service="billing")
    try:
        direct = await ctx.invoke_tool("deploy", {"service": "payments"}, idempotency="at_most_once", run=lambda: "ran")
        direct = {"returned": direct}
    except PolicyError as e:
        direct = {"class": type(e).__name__, "reason": Exception.__str__(e), "rule_id": e.rule_id, "code": e.code}
    return {"as_tool": as_tool, "direct": direct}


async def hang(data: dict) -> dict:
    try:
        first = await slow(n=1)
        seen({"where": "handler", "after": "slow"})
        return {"first": first, "second": await echo(text="after the cancel")}
    except BaseException as e:
        seen({"where": "handler", "exception": type(e).__name__, "message": str(e)})
        raise


async def expire(data: dict) -> dict:
    try:
        return {"returned": await execution().invoke_tool("deploy_fast", {"service": "x"}, run=lambda: "ran")}
    except PolicyError as e:
        return {"class": type(e).__name__, "reason": Exception.__str__(e), "rule_id": e.rule_id}


async def budget(data: dict) -> dict:
    """Two LLM calls under a token budget: the second is refused, and the refusal fails the run."""
    async with http_client(timeout=30) as llm:
        first = await llm.post(llm_url(), json={"model": "budget-1", "messages": []})
        second = await llm.post(llm_url(), json={"model": "budget-1", "messages": [{"role": "user", "content": "again"}]})
        seen({"first": first.status_code, "second": second.status_code, "body": second.json()})
        raise_for_refusal(RuntimeError(second.text))
    return {"unreachable": True}


async def prev(data: dict) -> dict:
    return {"previous": await previous()}


async def delegating(data: dict) -> dict:
    if "child" in data:
        return {"child": await delegate(child=data["child"])}
    ok = await delegate(child={"mode": "many", "count": 3}, session=data.get("session", ""))
    try:
        await delegate(child={"mode": "fail_agent"})
        failed = None
    except ToolError as e:
        failed = {"class": type(e).__name__, "str": str(e), "tool_id": e.tool_id}
    return {"ok": ok, "failed": failed}


async def park(data: dict) -> dict:
    seen({"where": "start", "attempt": execution().dispatch_attempt})
    try:
        pings = [await ping(n=i) for i in range(2)]
    except BaseException as e:
        seen({"where": "handler", "exception": type(e).__name__})
        raise
    return {"pings": pings}


async def many(data: dict) -> dict:
    total = 0
    for i in range(int(data["count"])):
        total += await step(f"n{i % 5}", lambda i: i, args={"i": i})
    return {"total": total}


async def fail_agent(data: dict) -> dict:
    raise ValueError("boom")


async def fail_tool(data: dict) -> dict:
    return await explode(why="no luck")


async def fail_policy(data: dict) -> dict:
    return await execution().invoke_tool("forbidden", {}, run=lambda: "never")


async def fail_rate(data: dict) -> dict:
    first = await limited(n=0)
    second = await limited(n=1)
    return {"first": first, "second": second}


MODES = {
    "basics": basics,
    "stream": stream_only,
    "gate": gate,
    "hang": hang,
    "park": park,
    "many": many,
    "expire": expire,
    "budget": budget,
    "prev": prev,
    "delegate": delegating,
    "fail_agent": fail_agent,
    "fail_tool": fail_tool,
    "fail_policy": fail_policy,
    "fail_rate": fail_rate,
}


async def process(data: dict):
    return await MODES[data["mode"]](data)


agent = Agent(os.environ.get("AGENT_ID", "surface"), description="Exercises the SDK surface.")
agent.run(process, host="127.0.0.1", port=int(os.environ["AGENT_PORT"]))
