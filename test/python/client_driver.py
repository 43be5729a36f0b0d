"""The client side of PythonClient.test.ts, through the SDK's ``Client`` only.

SCENARIO picks what it does; it prints one JSON report on stdout. Every
exception the SDK raises is reported as ``{"error": {"class", "code",
"status", "message"}}`` so the test can compare classes and codes; every wait
has a deadline (WAIT_SECONDS, default 20) and exits 2 with the last state.

Scenarios: ``basics`` (reads of a finished ``basics`` run and a fork of it),
``approvals`` (deny, expiry, cancel with a pending approval), ``cancel_running``
(twice: released after the cancel, and left hanging), ``cancel_parked``,
``follow`` (the event log followed while the run goes, then paged),
``errors`` (error classes, sessions, idempotency, parents, forks, failure
reasons), ``identity`` and ``approval_filter`` (what the SDK expects
and the kernel does not do; see the test's report), ``tree`` (subagents: one that completes, one that fails, and a
cancelled parent), ``auth`` (bearer tokens and scoped API keys from KEYS, a
JSON object name → token).
"""

import asyncio
import json
import os
import sys
import time
from pathlib import Path

from rebuno import Client, NetworkError
from rebuno.types import SpawnedBy

DEADLINE = float(os.environ.get("WAIT_SECONDS", "20"))
COUNTER_DIR = Path(os.environ.get("COUNTER_DIR", "."))
TERMINAL = ("completed", "failed", "cancelled")


def dump(value):
    if isinstance(value, list):
        return [dump(v) for v in value]
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


def error(e: BaseException) -> dict:
    return {
        "error": {
            "class": type(e).__name__,
            "code": getattr(e, "code", None),
            "status": getattr(e, "status_code", None),
            "message": str(e),
        }
    }


async def attempt(coro):
    """The call's parsed answer, or the exception it raised, as JSON."""
    try:
        return {"ok": dump(await coro)}
    except Exception as e:  # every SDK error, reported by class
        return error(e)


async def wait_for(what, probe):
    start = time.monotonic()
    last = None
    while time.monotonic() - start < DEADLINE:
        done, last = await probe()
        if done:
            return last
        await asyncio.sleep(0.05)
    print(f"timed out after {DEADLINE}s waiting for {what}; last seen: {dump(last)!r}", file=sys.stderr)
    sys.exit(2)


async def status_is(client, execution_id, *statuses):
    async def probe():
        ex = await client.get(execution_id)
        return ex.status in statuses, ex

    return await wait_for(f"{execution_id} to be {statuses}", probe)


async def finished(client, execution_id):
    return await status_is(client, execution_id, *TERMINAL)


async def executing(client, execution_id, target):
    async def probe():
        steps = await client.list_steps(execution_id)
        return any(s.target == target and s.status == "executing" for s in steps), steps

    return await wait_for(f"{target} to be executing", probe)


# --- scenarios ---------------------------------------------------------------


async def basics(c: Client) -> dict:
    created = await c.create("surface", {"mode": "basics"})
    final = await finished(c, created.id)
    steps = await c.list_steps(created.id)
    events = await c.events(created.id, limit=1000)
    last_step_seq = [e for e in events if e.type.startswith("step.")][-1].event_seq
    forked = await c.fork(created.id, at_seq=last_step_seq)
    fork_final = await finished(c, forked.id)
    return {
        "created": dump(created),
        "final": dump(final),
        "steps": dump(steps),
        "terminal_steps": dump(await c.list_steps(created.id, status="terminal")),
        "got_steps": [dump(await c.get_step(created.id, s.step_id)) for s in steps],
        "events": dump(events),
        "fork_at": last_step_seq,
        "forked": dump(forked),
        "fork_final": dump(fork_final),
        "fork_steps": dump(await c.list_steps(forked.id)),
    }


async def approvals(c: Client) -> dict:
    out: dict = {}
    gate = await c.create("surface", {"mode": "gate"})
    await status_is(c, gate.id, "blocked")
    [first] = [a for a in await c.list_approvals() if a.execution_id == gate.id]
    out["first"] = dump(await c.get_approval(first.id))
    out["filtered_denied"] = [a.id for a in await c.list_approvals(status="denied")]
    out["grant_by_mallory"] = await attempt(c.grant_approval(first.id, decided_by="mallory"))
    out["deny"] = await attempt(c.deny_approval(first.id, decided_by="alice", rationale="not today"))
    out["deny_again"] = await attempt(c.deny_approval(first.id, decided_by="alice"))
    out["first_after"] = dump(await c.get_approval(first.id))

    async def second_pending():
        mine = [a for a in await c.list_approvals() if a.execution_id == gate.id]
        return len(mine) == 1, mine

    [second] = await wait_for("the second approval", second_pending)
    out["deny_second"] = await attempt(c.deny_approval(second.id, decided_by="alice"))
    out["gate_final"] = dump(await finished(c, gate.id))
    out["gate_events"] = dump(await c.events(gate.id))
    out["second_after"] = dump(await c.get_approval(second.id))
    out["bad_id"] = await attempt(c.get_approval("not-a-uuid"))
    out["unknown_id"] = await attempt(c.get_approval(gate.id))

    # expiry (a 1 s approval timeout)
    expiring = await c.create("surface", {"mode": "expire"})
    out["expire_final"] = dump(await finished(c, expiring.id))
    expired = [e for e in await c.events(expiring.id) if e.type == "approval.expired"]
    out["expired"] = dump(await c.get_approval(expired[0].payload["approval_id"])) if expired else None

    # cancel while an approval is pending
    cancelled = await c.create("surface", {"mode": "gate"})
    await status_is(c, cancelled.id, "blocked")
    [pending] = [a for a in await c.list_approvals() if a.execution_id == cancelled.id]
    out["cancel"] = await attempt(c.cancel(cancelled.id))
    out["cancelled"] = dump(await c.get(cancelled.id))
    out["cancelled_approval"] = dump(await c.get_approval(pending.id))
    out["cancelled_listed"] = [a.id for a in await c.list_approvals() if a.execution_id == cancelled.id]
    out["grant_after_cancel"] = await attempt(c.grant_approval(pending.id, decided_by="alice"))
    out["cancelled_events"] = dump(await c.events(cancelled.id))
    out["cancelled_steps"] = dump(await c.list_steps(cancelled.id))
    return out


async def cancel_running(c: Client) -> dict:
    out: dict = {}
    # released: the tool returns right after the cancel, the handler goes on
    released = await c.create("surface", {"mode": "hang"})
    await executing(c, released.id, "slow")
    out["released_cancel"] = await attempt(c.cancel(released.id))
    (COUNTER_DIR / f"release-{released.id}").write_text("")
    out["released"] = dump(await c.get(released.id))
    out["released_cancel_again"] = await attempt(c.cancel(released.id))
    # hanging: the tool never returns; the SDK's next heartbeat stops it
    hanging = await c.create("surface", {"mode": "hang"})
    await executing(c, hanging.id, "slow")
    out["hanging_cancel"] = await attempt(c.cancel(hanging.id))
    out["hanging"] = dump(await c.get(hanging.id))
    out["ids"] = {"released": released.id, "hanging": hanging.id}
    out["hanging_steps"] = dump(await c.list_steps(hanging.id))
    out["hanging_events"] = dump(await c.events(hanging.id))
    return out


async def cancel_parked(c: Client) -> dict:
    parked = await c.create("surface", {"mode": "park"})

    async def rate_limited():
        events = await c.events(parked.id)
        return any(e.type == "step.rate_limited" for e in events), events

    await wait_for("the run to park", rate_limited)
    before = await c.get(parked.id)
    cancel = await attempt(c.cancel(parked.id))
    return {"id": parked.id, "before": dump(before), "cancel": cancel, "after": dump(await c.get(parked.id))}


async def follow(c: Client) -> dict:
    created = await c.create("surface", {"mode": "many", "count": int(os.environ.get("COUNT", "250"))})
    followed, after, polls = [], 0, 0
    start = time.monotonic()
    while time.monotonic() - start < DEADLINE:
        page = await c.events(created.id, after_seq=after, limit=50)
        polls += 1
        followed += page
        if page:
            after = page[-1].event_seq
        if any(e.type.startswith("execution.") and e.type != "execution.created"
               and e.type != "execution.started" for e in page):
            break
        if not page:
            await asyncio.sleep(0.02)
    paged, after = [], 0
    while True:
        page = await c.events(created.id, after_seq=after, limit=1000)
        if not page:
            break
        paged += page
        after = page[-1].event_seq
    steps = await c.list_steps(created.id)
    return {
        "id": created.id,
        "final": dump(await c.get(created.id)),
        "followed": [[e.event_seq, e.type] for e in followed],
        "polls": polls,
        "default_page": [e.event_seq for e in await c.events(created.id)],
        "capped_page": len(await c.events(created.id, limit=5000)),
        "zero_limit": len(await c.events(created.id, limit=0)),
        "paged": [e.event_seq for e in paged],
        "past_end": dump(await c.events(created.id, after_seq=paged[-1].event_seq)),
        "steps": [[s.step_id, s.target, s.status, s.result] for s in steps],
        "terminal_steps": len(await c.list_steps(created.id, status="terminal")),
    }


async def errors(c: Client) -> dict:
    out: dict = {}
    unknown = "01920000-0000-7000-8000-000000000000"
    out["get_unknown"] = await attempt(c.get(unknown))
    out["get_bad_id"] = await attempt(c.get("not-a-uuid"))
    out["events_unknown"] = await attempt(c.events(unknown))
    out["steps_unknown"] = await attempt(c.list_steps(unknown))
    out["cancel_unknown"] = await attempt(c.cancel(unknown))
    out["create_unknown_agent"] = await attempt(c.create("nobody", {}))
    out["create_blank_session"] = await attempt(c.create("surface", {"mode": "many", "count": 1}, session="  "))
    out["fork_unknown"] = await attempt(c.fork(unknown, at_seq=1))

    # the failure reasons the agent reports
    for mode in ("fail_agent", "fail_tool", "fail_policy", "fail_rate", "budget"):
        ex = await c.create("surface", {"mode": mode})
        out[mode] = dump(await finished(c, ex.id))
    failed_id = out["fail_agent"]["id"]

    # a completed base execution, then everything hung on it
    base = await c.create("surface", {"mode": "basics"})
    base = await finished(c, base.id)
    out["base_id"] = base.id
    steps = await c.list_steps(base.id)
    other = await c.create("surface", {"mode": "many", "count": 1})
    await finished(c, other.id)
    out["get_step_unknown"] = await attempt(c.get_step(base.id, "a" * 64))
    out["get_step_other_execution"] = await attempt(c.get_step(other.id, steps[0].step_id))
    out["idempotent"] = [
        await attempt(c.create("surface", {"mode": "many", "count": 1}, idempotency_key="order-7")),
        await attempt(c.create("surface", {"mode": "other"}, idempotency_key="order-7")),
    ]
    child = await c.create("surface", {"mode": "prev"}, parent_execution_id=base.id, session="child-of-base")
    out["child"] = dump(child)
    out["child_final"] = dump(await finished(c, child.id))
    out["child_again"] = await attempt(
        c.create("surface", {"mode": "prev"}, parent_execution_id=base.id, session="child-of-base")
    )
    out["parent_not_completed"] = await attempt(
        c.create("surface", {"mode": "prev"}, parent_execution_id=failed_id)
    )
    out["spawned_by_terminal"] = await attempt(
        c.create("surface", {"mode": "many", "count": 1}, spawned_by=SpawnedBy(execution_id=base.id, step_id=steps[0].step_id))
    )
    latest = (await c.events(base.id, limit=1000))[-1].event_seq
    out["latest_seq"] = latest
    out["fork_at_zero"] = await attempt(c.fork(base.id, at_seq=0))
    out["fork_past_end"] = await attempt(c.fork(base.id, at_seq=latest + 1))
    out["fork_bad_policy"] = await attempt(c.fork(base.id, at_seq=latest, policy_bundle="rules: [oops"))
    out["fork_taken_session"] = await attempt(c.fork(base.id, at_seq=latest, session="child-of-base"))
    out["fork_in_session"] = await attempt(c.fork(base.id, at_seq=latest, session="fork-session"))

    # one running execution per session: the second waits
    first = await c.create("surface", {"mode": "many", "count": 2}, session="queue")
    second = await c.create("surface", {"mode": "many", "count": 1}, session="queue")
    out["session_created"] = [dump(first), dump(second)]
    out["session_final"] = [dump(await finished(c, first.id)), dump(await finished(c, second.id))]

    # transport failures
    async with Client(os.environ["REFUSED_URL"]) as refused:
        out["refused"] = await attempt(refused.get(unknown))
    async with Client(os.environ["BLACKHOLE_URL"], timeout=0.5) as silent:
        out["timeout"] = await attempt(silent.get(unknown))
    url = os.environ.pop("REBUNO_URL")
    try:
        Client()
        out["no_url"] = None
    except ValueError as e:
        out["no_url"] = str(e)
    finally:
        os.environ["REBUNO_URL"] = url
    return out


async def tree(c: Client) -> dict:
    out: dict = {}
    parent = await c.create("surface", {"mode": "delegate", "session": "kids"})
    out["final"] = dump(await finished(c, parent.id))
    out["steps"] = dump(await c.list_steps(parent.id))
    out["events"] = dump(await c.events(parent.id))
    # a parent cancelled while its child runs
    cancelled = await c.create("surface", {"mode": "delegate", "child": {"mode": "hang"}})
    await status_is(c, cancelled.id, "blocked")
    out["cancel"] = await attempt(c.cancel(cancelled.id))
    out["cancelled"] = dump(await c.get(cancelled.id))
    out["cancelled_steps"] = dump(await c.list_steps(cancelled.id))
    out["cancelled_id"] = cancelled.id
    return out


async def auth(url: str) -> dict:
    keys = json.loads(os.environ["KEYS"])
    out: dict = {}
    async with Client(url, api_key="") as anonymous, Client(url, api_key="wrong") as wrong:
        out["anonymous"] = await attempt(anonymous.create("typed", {"item": "tea"}))
        out["wrong"] = await attempt(wrong.list_approvals())
    async with Client(url, api_key=keys["bootstrap"]) as boot:
        created = await boot.create("typed", {"item": "tea", "qty": 2})
        out["tea"] = dump(await finished(boot, created.id))
        split = await boot.create("typed", {"item": "cup", "qty": 3, "split": True})
        out["split"] = dump(await finished(boot, split.id))
        out["split_steps"] = dump(await boot.list_steps(split.id))
        bad = await boot.create("typed", {"item": 5, "qty": "many"})
        out["invalid"] = dump(await finished(boot, bad.id))
        missing = await boot.create("typed", {"qty": 1})
        out["missing"] = dump(await finished(boot, missing.id))
    step_id = out["split_steps"][0]["step_id"]
    async with Client(url, api_key=keys["reader"]) as reader:
        out["reader"] = {
            "get": await attempt(reader.get(created.id)),
            "events": await attempt(reader.events(created.id)),
            "list_steps": await attempt(reader.list_steps(split.id)),
            "get_step": await attempt(reader.get_step(split.id, step_id)),
            "create": await attempt(reader.create("typed", {"item": "tea"})),
            "cancel": await attempt(reader.cancel(created.id)),
            "fork": await attempt(reader.fork(created.id, at_seq=1)),
            "list_approvals": await attempt(reader.list_approvals()),
        }
    async with Client(url, api_key=keys["writer"]) as writer:
        first = await attempt(writer.create("typed", {"item": "mug"}, idempotency_key="w-1"))
        out["writer"] = {
            "create": first,
            "create_again": await attempt(writer.create("typed", {"item": "other"}, idempotency_key="w-1")),
            "get": await attempt(writer.get(created.id)),
            "fork": await attempt(writer.fork(created.id, at_seq=1)),
            "fork_with_policy": await attempt(writer.fork(created.id, at_seq=1, policy_bundle="default_action: allow\n")),
        }
    async with Client(url, api_key=keys["forker"]) as forker:
        out["forker"] = {
            "fork_with_policy": await attempt(forker.fork(created.id, at_seq=1, policy_bundle="default_action: allow\n"))
        }
    async with Client(url, api_key=keys["approver"]) as approver:
        out["approver"] = {
            "list_approvals": await attempt(approver.list_approvals()),
            "get": await attempt(approver.get(created.id)),
        }
    for name in ("rotated_old", "rotated_new", "revoked"):
        async with Client(url, api_key=keys[name]) as holder:
            out[name] = await attempt(holder.get(created.id))
    out["ids"] = {"tea": created.id, "split": split.id}
    return out


async def identity(c: Client) -> dict:
    """What the kernel does with ``on_behalf_of`` (C.15 #2)."""
    created = await attempt(c.create("surface", {"mode": "many", "count": 1}, on_behalf_of="bob"))
    out = {"created": created}
    if "ok" in created:
        out["final"] = dump(await finished(c, created["ok"]["id"]))
    return out


async def approval_filter(c: Client) -> dict:
    """``list_approvals(status=…)`` with one denied and one pending approval of an execution."""
    gate = await c.create("surface", {"mode": "gate"})
    await status_is(c, gate.id, "blocked")
    [first] = [a for a in await c.list_approvals() if a.execution_id == gate.id]
    await c.deny_approval(first.id, decided_by="alice", rationale="no")

    async def second_pending():
        mine = [a for a in await c.list_approvals() if a.execution_id == gate.id]
        return len(mine) == 1 and mine[0].id != first.id, mine

    [second] = await wait_for("the second approval", second_pending)
    out = {"first": first.id, "second": second.id}
    for status in ("pending", "denied", "granted"):
        out[status] = [[a.id, a.status] for a in await c.list_approvals(status=status) if a.execution_id == gate.id]
    await c.deny_approval(second.id, decided_by="alice")
    await finished(c, gate.id)
    return out


SCENARIOS = {
    "identity": identity,
    "approval_filter": approval_filter,
    "basics": basics,
    "approvals": approvals,
    "cancel_running": cancel_running,
    "cancel_parked": cancel_parked,
    "follow": follow,
    "errors": errors,
    "tree": tree,
}


async def main() -> None:
    scenario = os.environ["SCENARIO"]
    if scenario == "auth":
        report = await auth(os.environ["REBUNO_URL"])
    else:
        async with Client() as client:
            report = await SCENARIOS[scenario](client)
    print(json.dumps(report))


asyncio.run(main())
