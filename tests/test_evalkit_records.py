"""evalkit run-directory storage: append-only samples.jsonl that survives crashes, atomic JSON."""

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from rlhf_ext.evalkit.records import (RunDirError, SampleLog, generation_mismatch, read_json, sample_key,
                                      write_json_atomic)


def rec(pid, idx, **extra):
    return {"task": "math500", "problem_id": pid, "sample_index": idx, "response": f"r{pid}-{idx}", **extra}


def test_append_and_read_roundtrip(tmp_path):
    log = SampleLog(tmp_path / "samples.jsonl")
    with log:
        assert log.append([rec("a", 0), rec("a", 1, response="ünïcödé \\boxed{½}\n")]) == 2
        assert log.append([]) == 0
        log.append([rec("b", 0)])
    got = SampleLog(tmp_path / "samples.jsonl").read()
    assert [sample_key(r) for r in got] == [("math500", "a", 0), ("math500", "a", 1), ("math500", "b", 0)]
    assert got[1]["response"] == "ünïcödé \\boxed{½}\n"
    assert (tmp_path / "samples.jsonl").read_bytes().count(b"\n") == 3  # one line per record


def test_missing_file_reads_empty(tmp_path):
    assert SampleLog(tmp_path / "nope.jsonl").read() == []
    assert SampleLog(tmp_path / "nope.jsonl").repair() == 0


def test_torn_last_line_is_ignored_then_repaired(tmp_path):
    path = tmp_path / "samples.jsonl"
    with SampleLog(path) as log:
        log.append([rec("a", 0), rec("a", 1)])
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"task":"math500","problem_id":"a","sampl')  # a write cut short
    log = SampleLog(path)
    assert [r["sample_index"] for r in log.read()] == [0, 1]
    assert log.torn_bytes() == len(b'{"task":"math500","problem_id":"a","sampl')
    assert log.repair() == len(b'{"task":"math500","problem_id":"a","sampl')
    assert path.read_bytes() == whole
    with log:
        log.append([rec("a", 2)])
    assert [r["sample_index"] for r in SampleLog(path).read()] == [0, 1, 2]


def test_append_repairs_a_torn_tail_first(tmp_path):
    path = tmp_path / "samples.jsonl"
    path.write_bytes(json.dumps(rec("a", 0)).encode() + b"\n" + b'{"task": "ma')
    with SampleLog(path) as log:
        log.append([rec("a", 1)])
    assert [r["sample_index"] for r in SampleLog(path).read()] == [0, 1]


def test_torn_tail_longer_than_scan_block(tmp_path):
    path = tmp_path / "samples.jsonl"
    tail = b'{"task":"math500","response":"' + b"x" * 200_000
    path.write_bytes(json.dumps(rec("a", 0)).encode() + b"\n" + tail)
    assert SampleLog(path).torn_bytes() == len(tail)
    path.write_bytes(tail)  # no newline at all
    assert SampleLog(path).torn_bytes() == len(tail)
    assert SampleLog(path).read() == []


def test_duplicates_keep_the_first_and_warn(tmp_path):
    path = tmp_path / "samples.jsonl"
    with SampleLog(path) as log:
        log.append([rec("a", 0, response="first"), rec("a", 0, response="second"), rec("a", 1)])
    with pytest.warns(UserWarning, match="1 duplicate"):
        got = SampleLog(path).read()
    assert [r["response"] for r in got] == ["first", "ra-1"]


@pytest.mark.parametrize("bad", [b"not json", b'{"task": "math500"}', b'{"task":"m","problem_id":"a","sample_index":"x"}'])
def test_corrupt_line_in_the_middle_is_an_error_naming_the_line(tmp_path, bad):
    path = tmp_path / "samples.jsonl"
    path.write_bytes(json.dumps(rec("a", 0)).encode() + b"\n" + bad + b"\n" + json.dumps(rec("a", 1)).encode() + b"\n")
    with pytest.raises(RunDirError, match=r"samples.jsonl:2: corrupt"):
        SampleLog(path).read()


WRITER = textwrap.dedent("""
    import sys
    from rlhf_ext.evalkit.records import SampleLog
    log = SampleLog(sys.argv[1], fsync_interval=0.0)
    i = 0
    while True:
        # big records make a kill in the middle of a write likely
        log.append([{"task": "t", "problem_id": str(i), "sample_index": j, "response": "y" * 50000}
                    for j in range(4)])
        i += 1
        if i == 3:
            print("writing", flush=True)
""")


def test_sigkill_mid_run_leaves_a_readable_file_and_resume_never_duplicates(tmp_path):
    path = tmp_path / "samples.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    log = SampleLog(path)
    got = log.read()  # must not raise, whatever the kill cut
    assert len(got) >= 12
    keys = [sample_key(r) for r in got]
    assert len(keys) == len(set(keys))
    assert all(r["response"] == "y" * 50000 for r in got)
    # a resumed run appends after repairing: the file stays fully parseable
    with log:
        log.append([{"task": "t", "problem_id": "resumed", "sample_index": 0, "response": "z"}])
    again = SampleLog(path).read()
    assert again[-1]["problem_id"] == "resumed" and len(again) == len(got) + 1
    assert path.read_bytes().endswith(b"\n")


def test_write_json_atomic(tmp_path):
    target = tmp_path / "sub" / "config.json"
    write_json_atomic(target, {"a": 1, "b": "ü"})
    write_json_atomic(target, {"a": 2})
    assert read_json(target) == {"a": 2}
    assert [p.name for p in target.parent.iterdir()] == ["config.json"]  # no temp files left
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644


def test_read_json_errors(tmp_path):
    with pytest.raises(RunDirError, match="does not exist"):
        read_json(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(RunDirError, match="not valid JSON"):
        read_json(tmp_path / "bad.json")


def test_generation_mismatch_names_each_difference():
    stored = {"temperature": 0.6, "top_p": 0.95, "seed": 0}
    assert generation_mismatch(stored, dict(stored)) == []
    diffs = generation_mismatch(stored, {"temperature": 1.0, "top_p": 0.95, "seed": 0, "template": "r1"})
    assert len(diffs) == 2
    assert any(d.startswith("temperature: run has 0.6, requested 1.0") for d in diffs)
    assert any(d.startswith("template:") for d in diffs)
