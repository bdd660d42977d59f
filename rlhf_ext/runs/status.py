"""A run's status, read from its ``events.jsonl``: the one rule every reader uses (:func:`run_status`)."""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence, Tuple

from .files import as_number

END_STATUSES = ("finished", "stopped_by_guard", "crashed")
RUNNING = "running"
UNKNOWN = "unknown"


def run_status(events: Sequence[Mapping[str, Any]]) -> Tuple[str, Optional[int]]:
    """(status, exit code) of a run from its ``events.jsonl``: the one rule every reader uses.

    * the last ``end`` event after the last ``start``/``resume``: its status when it is one of
      :data:`END_STATUSES`, else ``ended (<what it says>)`` (a writer newer than this reader, or a
      damaged line: shown, never mistaken for a known outcome), with its exit code;
    * a ``start`` or ``resume`` with no ``end`` after it: ``running`` (or killed too hard to write
      its end: SIGKILL, the OOM killer);
    * neither (no events, or only events that say nothing about the process, such as a torn file
      that lost its start): ``unknown``. A ``config.json`` alone is written before the start event,
      so it shows only that a run was set up, not that it is running.
    """
    last_start = max((i for i, e in enumerate(events) if e.get("event") in ("start", "resume")), default=-1)
    last_end = max((i for i, e in enumerate(events) if e.get("event") == "end"), default=-1)
    if last_start < 0 and last_end < 0:
        return UNKNOWN, None
    if last_start > last_end:
        return RUNNING, None
    end = events[last_end]
    status = end.get("status")
    code = end.get("exit_code")
    ok, number = as_number(code)
    code = int(number) if ok and code is not None and math.isfinite(number) else None
    if status in END_STATUSES:
        return str(status), code
    return f"ended ({status if status is not None else 'no status'})", code
