"""The incidents of runs, read from their records: guard incidents, non-finite inputs and metrics,
mismatch warnings, restarts and abnormal ends, one row each."""

from __future__ import annotations

from typing import List, Sequence, Tuple

from .configdiff import format_value
from .loaded_runs import RunRecord


def steps_text(steps: Sequence[int], limit: int = 12) -> str:
    shown = ", ".join(map(str, steps[:limit]))
    return shown + (f" \u2026 ({len(steps)} in all)" if len(steps) > limit else "")


def incident_rows(runs: Sequence[RunRecord]) -> List[Tuple[str, int, str, str]]:
    """``(run, step, kind, detail)`` for guard incidents, mismatch warnings, restarts, abnormal ends
    and non-finite metric values, sorted by run then step."""
    rows = []
    for run in runs:
        incident_files = {inc.get("file"): inc for inc in run.incidents}
        for e in run.events:
            kind, step = e.get("event"), e.get("step")
            step = int(step) if isinstance(step, (int, float)) and not isinstance(step, bool) else -1
            if kind == "guard_incident":
                inc = incident_files.get(e.get("incident")) or {}
                detail = (f"non-finite {e.get('tensor', inc.get('tensor', '?'))} on rank {e.get('rank', inc.get('rank', '?'))}"
                          f", mode {e.get('mode', '?')}")
                if inc:
                    if inc.get("micro_batch") is not None:
                        detail += f", micro-batch {inc['micro_batch']}"
                    origin = inc.get("origin")
                    if isinstance(origin, dict) and origin.get("name"):
                        detail += (f", from {origin['name']} ({origin.get('nan_count')} NaN, "
                                   f"{origin.get('inf_count')} Inf, first at {tuple(origin.get('first_index') or ())})")
                        if inc.get("policy_loss_type"):
                            detail += f" of policy loss {inc['policy_loss_type']}"
                    if inc.get("sample_indices"):
                        detail += f", {len(inc['sample_indices'])} sample(s)"
                    detail += f"; last good checkpoint: {inc.get('last_good_checkpoint') or 'none'}"
                rows.append((run.name, step, "guard incident", detail))
            elif kind == "nonfinite_input":
                rows.append((run.name, step, "non-finite input",
                             f"{e.get('check', '?')} in {e.get('where', '?')}: {e.get('nan_count')} NaN, "
                             f"{e.get('inf_count')} Inf, first at {tuple(e.get('first_index') or ())}; "
                             "left to the guard"))
            elif kind == "mismatch_warning":
                value, threshold = e.get("value"), e.get("threshold")
                detail = f"{e.get('metric', '?')} = {format_value(value)} (threshold {format_value(threshold)})"
                if e.get("message"):
                    detail += f": {e['message']}"
                rows.append((run.name, step, "mismatch warning", detail))
            elif kind == "resume":
                rows.append((run.name, step, "restart", f"resumed at step {step}"))
            elif kind == "end" and e.get("status") not in ("finished", None):
                rows.append((run.name, step, "end: " + str(e.get("status")).replace("_", " "),
                             f"exit code {e.get('exit_code', '?')}"))
        if not any(e.get("event") == "resume" for e in run.events):
            for step in run.resumes:
                rows.append((run.name, step, "restart", f"steps restart at {step} in metrics.jsonl"))
        if run.status == "running":
            rows.append((run.name, run.last_step if run.last_step is not None else -1, "no end record",
                         "still running, or killed without writing its end"))
        for key, steps in sorted(run.nonfinite.items()):
            rows.append((run.name, steps[0], "non-finite metric", f"{key} at step(s) {steps_text(steps)}"))
    order = {r.name: i for i, r in enumerate(runs)}
    return sorted(rows, key=lambda r: (order[r[0]], r[1]))
