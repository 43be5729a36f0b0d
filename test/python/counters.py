"""Side-effect counters the test reads: one file per name under COUNTER_DIR.

A tool body calls ``bump("name")`` once each time it really runs; a recorded
step that replays never reaches its body, so the file shows how often the
effect happened.
"""

import os
from pathlib import Path


def bump(name: str) -> int:
    path = Path(os.environ["COUNTER_DIR"]) / name
    count = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(count))
    return count
