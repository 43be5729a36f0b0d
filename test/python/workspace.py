"""An agent with a resource: a local directory checkpointed by the SDK.

``DirDriver`` is a resource driver in the official SDK's terms (``driver_id``,
``configuration``, ``create``, ``open``, ``checkpoint``): each environment is
a directory under WORKSPACE_ROOT/envs, and a checkpoint copies it into a
content-addressed store (WORKSPACE_ROOT/snapshots/<sha256 of the files>).
``create(checkpoint_ref)`` restores a snapshot into a new directory — that is
how a fork starts from a checkpoint.

The handler registers the ``workspace`` resource with
``CheckpointPolicy(every_steps=1)`` (a capture after every writing step and on
completion), writes each file of its input with the ``write_file`` tool
(which declares the resource), then lists the directory with ``list_files``.
It returns what the directory held when the handler started (``initial``),
what it wrote and the final contents. With HANG_ON=<name> the write of that
file leaves ``PARTIAL`` behind and hangs: the test kills the process there.
"""

import asyncio
import hashlib
import logging
import os
import shutil
import uuid
from pathlib import Path

from counters import bump
from rebuno import Agent, CheckpointPolicy, CheckpointUnavailable, execution, resource, tool

logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")

ROOT = Path(os.environ["WORKSPACE_ROOT"])


def _files(path: Path) -> dict:
    return {p.name: p.read_text() for p in sorted(path.iterdir()) if p.is_file()}


class DirDriver:
    driver_id = "local.dir.v1"
    coverage_reuse = False

    def __init__(self, root: Path):
        self.root = root
        self.configuration = {"store": "sha256"}

    def create(self, checkpoint_ref):
        path = self.root / "envs" / uuid.uuid4().hex
        if checkpoint_ref:
            snapshot = self.root / "snapshots" / checkpoint_ref
            if not snapshot.is_dir():
                raise CheckpointUnavailable(f"snapshot {checkpoint_ref} is gone")
            shutil.copytree(snapshot, path)
        else:
            path.mkdir(parents=True)
        return str(path), {"path": str(path)}

    def open(self, binding):
        return binding["path"]

    def checkpoint(self, handle):
        files = _files(Path(handle))
        digest = hashlib.sha256()
        for name, text in files.items():
            digest.update(name.encode() + b"\0" + text.encode() + b"\0")
        ref = digest.hexdigest()[:32]
        snapshot = self.root / "snapshots" / ref
        if not snapshot.exists():
            staging = self.root / "snapshots" / f".{ref}.{uuid.uuid4().hex}"
            shutil.copytree(handle, staging)
            os.replace(staging, snapshot)
        return ref


DRIVER = DirDriver(ROOT)
HANDLES: dict = {}


def _workspace() -> Path:
    return Path(HANDLES[execution().id])


@tool("write_file", resources=["workspace"])
async def write_file(name: str, text: str) -> dict:
    bump(f"write_{name}")
    path = _workspace() / name
    if os.environ.get("HANG_ON") == name:
        path.write_text("PARTIAL")
        await asyncio.sleep(3600)
    path.write_text(text)
    return {"name": name, "bytes": len(text)}


@tool("list_files")
async def list_files() -> dict:
    return _files(_workspace())


async def process(files: list) -> dict:
    handle = await resource("workspace", driver=DRIVER, checkpoints=CheckpointPolicy(every_steps=1))
    HANDLES[execution().id] = handle
    initial = _files(Path(handle))
    written = [await write_file(name=f["name"], text=f["text"]) for f in files]
    listing = await list_files()
    return {"initial": initial, "written": written, "files": listing, "path": handle}


agent = Agent("workspace", description="Writes files into a checkpointed directory.")
agent.run(process, host="127.0.0.1", port=int(os.environ["AGENT_PORT"]))
