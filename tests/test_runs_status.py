"""The run-status rule, tested once: :func:`rlhf_ext.runs.run_status` decides, and every reader
(``rlhf-ext runs show``, ``rlhf-ext runs check``, ``rlhf-ext report``) shows the same answer."""

from __future__ import annotations

import json

import pytest

from rlhf_ext import runs
from rlhf_ext.report import load_run
from rlhf_ext.runs.check import check_run

START = {"event": "start", "step": 0}
RESUME = {"event": "resume", "step": 5}
CKPT = {"event": "checkpoint", "step": 2, "path": "/c/global_step2"}


def end(status, code=0):
    ev = {"event": "end", "step": 3, "exit_code": code}
    if status is not None:
        ev["status"] = status
    return ev


CASES = [
    ([], ("unknown", None)),  # config.json alone: set up, never seen to start
    ([CKPT], ("unknown", None)),  # events that say nothing about the process (its start line lost)
    ([START], ("running", None)),
    ([START, CKPT], ("running", None)),
    ([START, end("finished")], ("finished", 0)),
    ([START, end("stopped_by_guard", 3)], ("stopped_by_guard", 3)),
    ([START, end("crashed", 1)], ("crashed", 1)),
    ([START, end("crashed", 1), RESUME], ("running", None)),  # resumed after a crash, not ended yet
    ([START, end("crashed", 1), RESUME, end("finished")], ("finished", 0)),
    ([end("finished")], ("finished", 0)),  # an end whose start line was lost still says how it ended
    ([START, end("paused_by_user", 0)], ("ended (paused_by_user)", 0)),  # a status this reader does not know
    ([START, end(None, None)], ("ended (no status)", None)),  # never read as "finished"
    ([START, end("finished", 2.0)], ("finished", 2)),
    ([START, end("finished", "x")], ("finished", None)),
]


@pytest.mark.parametrize("events,expected", CASES)
def test_run_status_rule(events, expected):
    assert runs.run_status(events) == expected


def _record(path, events):
    path.mkdir(parents=True)
    (path / runs.CONFIG).write_text(json.dumps({"schema": runs.SCHEMA, "name": path.name, "args": {}}))
    runs.append_jsonl(path / runs.METRICS, runs.metrics_record(1, {"reward": 0.5}, now=1.0, started_at=0.0))
    for ev in events:
        runs.append_jsonl(path / runs.EVENTS, ev)
    return path


@pytest.mark.parametrize("events,expected", [c for c in CASES if c[0] in ([], [START], [START, end("crashed", 1)])])
def test_every_reader_shows_the_same_status(tmp_path, events, expected):
    run = _record(tmp_path / "r", events)
    status, code = expected
    assert (load_run(run).status, load_run(run).exit_code) == expected
    shown = f"status: {status}" + (f" (exit code {code})" if code is not None else "") + ";"
    assert shown in runs.summarize(run)
    ended = check_run(run).checks[0]
    assert ended.name == "ended" and ended.status == "FAIL"  # none of these finished


def test_the_report_reads_the_format_through_rlhf_ext_runs():
    from rlhf_ext.report import loaded_runs as report_runs

    assert (report_runs.CONFIG_FILE, report_runs.METRICS_FILE, report_runs.EVENTS_FILE, report_runs.INCIDENT_FILE) == \
        (runs.CONFIG, runs.METRICS, runs.EVENTS, runs.INCIDENT)
    assert report_runs._RESERVED == frozenset(runs.RESERVED_KEYS)
    assert report_runs.run_status is runs.run_status
    assert runs.SCHEMA == f"{runs.SCHEMA_PREFIX}{runs.SCHEMA_VERSION}"


def test_numbered_reader_warns_about_bad_lines_but_not_a_torn_tail(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"event": "start"}\n[1, 2]\n{bad\n\n{"event": "end", "status": "finished"}\n{"event": "e')
    warnings = []
    assert runs.read_jsonl_numbered(path, warnings) == [(1, {"event": "start"}),
                                                        (5, {"event": "end", "status": "finished"})]
    assert len(warnings) == 2 and "line 2" in warnings[0] and "line 3" in warnings[1]
    assert runs.read_jsonl(path) == [{"event": "start"}, {"event": "end", "status": "finished"}]
    assert runs.read_jsonl(tmp_path / "missing.jsonl") == []
