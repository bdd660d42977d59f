"""``queue status`` and ``queue stop``: read a queue directory, signal its runner."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Optional, TextIO

from .. import runs
from .lock import read_holder
from .manifest import Manifest


def _duration(entry) -> str:
    if not entry.get("started_at"):
        return "-"
    end = entry.get("ended_at") or time.time()
    s = int(end - entry["started_at"])
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def status(output, out: TextIO = sys.stdout) -> int:
    output = Path(output)
    m = Manifest.open(output)
    holder = read_holder(output)
    d = m.data
    runner = f"runner pid {holder} active" if holder else "no runner active"
    print(f"queue {d['suite']['name']} in {output.resolve()}: {d['status']} ({runner})", file=out)
    snap = d["snapshot"]
    git = (snap.get("git") or {}).get("cwd") or {}
    print(f"snapshot: rlhf_ext {snap['versions'].get('rlhf_ext')}, code sha256 {snap['code']['sha256'][:12]}, "
          f"git {str(git.get('commit'))[:12]}{' (dirty)' if git.get('dirty') else ''}", file=out)
    width = max([3] + [len(r["name"]) for r in d["runs"]])
    print(f"{'#':>2}  {'run':<{width}}  {'status':<14}  {'exit':>6}  {'time':>8}  reason", file=out)
    for i, r in enumerate(d["runs"], 1):
        code = r["exit_code"] if r["exit_code"] is not None else (r["signal"] or "-")
        note = " ".join(x for x in (r["reason"], f"(attempt {r['attempt']})" if r["attempt"] > 1 else None) if x)
        # a guard stop is a failure of the run, not a crash: its weights up to the last checkpoint are good
        shown = f"{r['status']} (guard)" if r.get("failure") == "guard" and r["status"] == "failed" else r["status"]
        line = f"{i:>2}  {r['name']:<{width}}  {shown:<14}  {str(code):>6}  {_duration(r):>8}  {note}"
        print(line.rstrip(), file=out)
    return 0


def stop(output, *, wait: float = 60.0, out: Optional[TextIO] = sys.stdout) -> int:
    """SIGTERM the runner of ``output`` (it stops its running command and marks it interrupted)."""
    output = Path(output)
    Manifest.open(output)  # a clear error if this is not a queue directory
    pid = read_holder(output)
    if not pid or pid < 0:
        if out:
            print(f"no runner is active in {output}", file=out)
        return 1
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and read_holder(output):
        time.sleep(0.2)
    if read_holder(output):
        if out:
            print(f"sent SIGTERM to runner pid {pid}; it is still stopping its run", file=out)
        return 0
    if out:
        print(f"stopped runner pid {pid}", file=out)
    return 0


def report(output, html=None, *, title: Optional[str] = None, out: Optional[TextIO] = sys.stdout) -> int:
    """Write ``rlhf-ext report``'s page for every run of the queue that left a run record, named as in
    the suite, with the evalkit outputs found in each run's directory; returns 0, or 1 when no run
    has a record yet."""
    from ..report import write_report

    output = Path(output)
    d = Manifest.open(output).data
    run_dirs, names, skipped = [], [], []
    for r in d["runs"]:
        record = r.get("record_dir")
        if record and (Path(record) / runs.CONFIG).is_file():
            run_dirs.append(record)
            names.append(r["name"])
        else:
            skipped.append(f"{r['name']} ({r['status']}, {'no record yet' if record else 'no record_dir in the suite'})")
    if skipped and out:
        print(f"not in the report: {', '.join(skipped)}", file=out)
    if not run_dirs:
        if out:
            print(f"no run of {output} has a run record yet", file=out)
        return 1
    evals = [r["run_dir"] for r in d["runs"] if r["name"] in names and Path(r["run_dir"]).is_dir()]
    html = Path(html) if html else output / "report.html"
    write_report(run_dirs, html, eval_dirs=evals, names=names,
                 title=title or f"{d['suite']['name']}: {len(run_dirs)} runs", quiet=out is None,
                 command=f"rlhf-ext queue report {output}")
    if out:
        print(f"wrote {html} ({len(run_dirs)} runs)", file=out)
    return 0
