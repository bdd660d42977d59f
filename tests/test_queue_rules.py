"""rlhf-ext queue rules with small real commands (bash / python): failure stops the queue, a rerun
continues after the done runs, exit 0 without the declared outputs is not done, the manifest
survives a kill mid-write, the lock, stop / Ctrl-C, dry run, the snapshot."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from rlhf_ext.queue import (
    EXIT_INTERRUPTED,
    QueueError,
    QueueLock,
    QueueLockedError,
    SuiteError,
    dry_run,
    load_suite,
    read_holder,
    run_queue,
)

PY = sys.executable


def write_suite(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body))
    return path


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def runs_by_name(out: Path) -> dict:
    return {r["name"]: r for r in manifest(out)["runs"]}


TWO_RUNS = """
    [suite]
    name = "two"

    [vars]
    flag = "/nonexistent"

    [[runs]]
    name = "a"
    commands = [["bash", "-c", "echo a-ran; mkdir -p {run_dir}/ckpt; date +%s%N > {run_dir}/ckpt/weights"]]
    expect = { checkpoint = "{run_dir}/ckpt/weights" }

    [[runs]]
    name = "b"
    commands = [["bash", "-c", "test -f {flag} || { echo no flag; exit 3; }"],
                ["bash", "-c", "mkdir -p {run_dir}/ckpt; echo ok > {run_dir}/ckpt/weights"]]
    expect = { checkpoint = "{run_dir}/ckpt/weights" }
"""


def test_failure_of_run_1_stops_the_queue_and_run_2_never_starts(tmp_path):
    suite = write_suite(tmp_path / "s.toml", """
        [suite]
        name = "stops"
        [[runs]]
        name = "first"
        commands = [["bash", "-c", "echo starting; exit 3"], ["bash", "-c", "touch {output}/second-command"]]
        expect = ["{run_dir}"]
        [[runs]]
        name = "second"
        commands = [["bash", "-c", "touch {output}/second-run"]]
        expect = ["{output}/second-run"]
    """)
    out = tmp_path / "q"
    assert run_queue(suite, out, out=None) == 1
    runs = runs_by_name(out)
    assert runs["first"]["status"] == "failed"
    assert runs["first"]["exit_code"] == 3
    assert runs["first"]["reason"] == "command 1 exited with code 3"
    assert runs["second"]["status"] == "pending" and runs["second"]["started_at"] is None
    assert not (out / "second-run").exists() and not (out / "second-command").exists()
    log = Path(runs["first"]["logs"][0]).read_text()
    assert "starting" in log
    assert manifest(out)["status"] == "failed"
    # nothing is retried unless asked
    assert run_queue(suite, out, out=None) == 1
    assert runs_by_name(out)["first"]["attempt"] == 1 and not (out / "second-run").exists()


def test_rerun_continues_after_done_runs_without_touching_them(tmp_path):
    suite = write_suite(tmp_path / "s.toml", TWO_RUNS)
    out = tmp_path / "q"
    flag = tmp_path / "flag"
    assert run_queue(suite, out, sets=[f"flag={flag}"], out=None) == 1
    a = runs_by_name(out)["a"]
    weights = Path(a["run_dir"]) / "ckpt" / "weights"
    before = (weights.read_text(), weights.stat().st_mtime_ns)
    assert a["status"] == "done" and runs_by_name(out)["b"]["status"] == "failed"

    flag.touch()
    assert run_queue(suite, out, retry_failed=True, out=None) == 0  # --set is remembered
    runs = runs_by_name(out)
    assert runs["a"]["status"] == "done" and runs["a"]["attempt"] == 1
    assert runs["a"]["started_at"] == a["started_at"]
    assert (weights.read_text(), weights.stat().st_mtime_ns) == before
    b = runs["b"]
    assert b["status"] == "done" and b["attempt"] == 2 and b["exit_code"] == 0
    # the failed attempt is kept, not overwritten
    assert len(b["previous_attempts"]) == 1
    old = b["previous_attempts"][0]
    assert old["status"] == "failed" and old["reason"] == "command 1 exited with code 3"
    assert "no flag" in (Path(old["moved_to"]) / "logs" / "1-bash.log").read_text()
    assert manifest(out)["status"] == "finished"
    # a finished queue reruns as a no-op
    assert run_queue(suite, out, out=None) == 0
    assert runs_by_name(out)["b"]["attempt"] == 2


def test_exit_0_without_its_checkpoint_is_not_done(tmp_path):
    suite = write_suite(tmp_path / "s.toml", """
        [suite]
        name = "nockpt"
        [[runs]]
        name = "quiet"
        commands = [["bash", "-c", "mkdir -p {run_dir}/record {run_dir}/hf; echo x > {run_dir}/record/events.jsonl; : > {run_dir}/eval.json"]]
        expect = { record = "{run_dir}/record/events.jsonl", evaluation = "{run_dir}/eval.json", checkpoint = "{run_dir}/hf" }
        [[runs]]
        name = "after"
        commands = [["true"]]
        expect = ["{output}"]
    """)
    out = tmp_path / "q"
    assert run_queue(suite, out, out=None) == 1
    r = runs_by_name(out)["quiet"]
    assert r["exit_code"] == 0 and r["status"] == "failed"
    assert r["reason"].startswith("exited 0 but missing: ")
    # an empty evaluation file and an empty checkpoint directory count as missing; the record is there
    assert sorted(m.split()[0] for m in r["missing"]) == ["checkpoint", "evaluation"]
    assert r["paths"]["record"] == [str(out.resolve() / "runs" / "quiet" / "record" / "events.jsonl")]
    assert runs_by_name(out)["after"]["status"] == "pending"


def test_signal_death_is_a_failure_with_the_signal_name(tmp_path):
    suite = write_suite(tmp_path / "s.toml", """
        [suite]
        name = "sig"
        [[runs]]
        name = "killed"
        commands = [["bash", "-c", "kill -KILL $$"]]
        expect = ["{run_dir}"]
    """)
    out = tmp_path / "q"
    assert run_queue(suite, out, out=None) == 1
    r = runs_by_name(out)["killed"]
    assert r["status"] == "failed" and r["signal"] == "SIGKILL" and r["exit_code"] is None
    assert "killed by SIGKILL" in r["reason"]


WRITER = """
import json, sys
sys.path.insert(0, {src!r})
from rlhf_ext.queue.manifest import atomic_write_json
from pathlib import Path
path = Path(sys.argv[1])
start = json.loads(path.read_text())["i"] if path.exists() else 0
i = start
while True:
    i += 1
    atomic_write_json(path, {{"schema": "x", "i": i, "pad": ["run-%d" % j for j in range(20000)]}})
    if i == start + 1:
        print("writing", flush=True)
"""


def test_manifest_survives_a_kill_mid_write(tmp_path):
    src = str(Path(__file__).resolve().parents[1])
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(src=src))
    target = tmp_path / "manifest.json"
    seen = set()
    for k in range(12):
        proc = subprocess.Popen([PY, str(script), str(target)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "writing"  # past the imports, writing in a loop
        time.sleep(0.02 + 0.011 * k)  # then killed at an arbitrary point of some write
        proc.kill()
        proc.wait()
        data = json.loads(target.read_text())  # never torn
        assert data["schema"] == "x" and len(data["pad"]) == 20000
        seen.add(data["i"])
    assert len(seen) == 12  # every writer got further than the one before it
    # stray temporary files of killed writers are never mistaken for the manifest
    assert all(p.name.startswith(".manifest.json.") for p in tmp_path.glob(".*.tmp"))


def test_lock_keeps_a_second_runner_off(tmp_path):
    suite = write_suite(tmp_path / "s.toml", TWO_RUNS)
    out = tmp_path / "q"
    out.mkdir()
    lock = QueueLock(out).acquire()
    try:
        assert read_holder(out) == os.getpid()
        with pytest.raises(QueueLockedError, match=f"pid {os.getpid()}"):
            run_queue(suite, out, out=None)
        res = subprocess.run([PY, "-m", "rlhf_ext.cli", "queue", "run", str(suite), "--output", str(out)],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and "another queue runner" in res.stderr
    finally:
        lock.release()
    assert read_holder(out) is None
    assert not (out / "manifest.json").exists()


SLOW = """
    [suite]
    name = "slow"
    [[runs]]
    name = "sleeper"
    # a child in its own session (as Ray's daemons are) and one in the command's process group
    commands = [["{python}", "-c", "import subprocess, time; a = subprocess.Popen(['sleep', '300'], start_new_session=True); b = subprocess.Popen(['sleep', '301']); open('{output}/pids', 'w').write('%d %d' % (a.pid, b.pid)); time.sleep(300)"]]
    expect = ["{run_dir}"]
    [[runs]]
    name = "next"
    commands = [["bash", "-c", "touch {output}/next-ran"]]
    expect = ["{output}/next-ran"]
"""


def _start_runner(suite: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([PY, "-m", "rlhf_ext.cli", "queue", "run", str(suite), "--output", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("how", ["queue stop", "SIGINT"])
def test_stop_kills_the_whole_run_and_marks_it_interrupted(tmp_path, how):
    suite = write_suite(tmp_path / "s.toml", SLOW)
    out = tmp_path / "q"
    runner = _start_runner(suite, out)
    try:
        started = _wait_for(lambda: runner.poll() is not None or ((out / "pids").exists()
                                                                    and (out / "pids").read_text().strip()))
        assert started and runner.poll() is None, runner.stdout.read() if runner.poll() is not None else "timeout"
        time.sleep(1.5)  # the runner learns the process tree once a second
        pids = [int(p) for p in (out / "pids").read_text().split()]
        entry = runs_by_name(out)["sleeper"]
        assert entry["status"] == "running" and entry["pgid"] == entry["pid"]
        assert all(psutil.pid_exists(p) for p in pids)
        if how == "queue stop":
            res = subprocess.run([PY, "-m", "rlhf_ext.cli", "queue", "stop", str(out)], capture_output=True,
                                 text=True, timeout=120)
            assert res.returncode == 0, res.stdout + res.stderr
            assert "stopped runner" in res.stdout
        else:
            runner.send_signal(signal.SIGINT)
        rc = runner.wait(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert rc == EXIT_INTERRUPTED
    entry = runs_by_name(out)["sleeper"]
    assert entry["status"] == "interrupted"
    assert entry["signal"] == ("SIGTERM" if how == "queue stop" else "SIGINT")
    assert entry["reason"].startswith("stopped by")
    assert manifest(out)["status"] == "interrupted"
    for pid in pids:
        assert _wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE,
                         timeout=15), f"process {pid} survived"
    assert runs_by_name(out)["next"]["status"] == "pending" and not (out / "next-ran").exists()
    assert read_holder(out) is None
    status = subprocess.run([PY, "-m", "rlhf_ext.cli", "queue", "status", str(out)], capture_output=True, text=True,
                            timeout=120)
    assert "interrupted" in status.stdout and "sleeper" in status.stdout


def test_dry_run_prints_resolved_commands_and_checks_inputs(tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    suite = write_suite(tmp_path / "s.toml", """
        [suite]
        name = "dry"
        [vars]
        common = ["--lr", "1e-6", "--data", "{inputs.prompts}"]
        [inputs]
        prompts = "{data_dir}/train.jsonl"
        [defaults]
        commands = [["{python}", "-m", "train", "{common}", "{algo}", "--out", "{run_dir}/ckpt"]]
        expect = { checkpoint = "{run_dir}/ckpt" }
        [[runs]]
        name = "grpo"
        vars = { algo = ["--estimator", "grpo"] }
        [[runs]]
        name = "rft"
        vars = { algo = ["--estimator", "rft", "--loss", "pg"] }
    """)
    out = tmp_path / "q"
    assert dry_run(suite, out, sets=[f"data_dir={tmp_path}"]) == 1  # the input does not exist yet
    text = capsys.readouterr().out
    assert "MISSING" in text and "error: input 'prompts'" in text
    data.write_text('{"prompt": "1+1", "label": "2"}\n')
    assert dry_run(suite, out, sets=[f"data_dir={tmp_path}"]) == 0
    text = capsys.readouterr().out
    snap_copy = out.resolve() / "snapshot" / "inputs" / "prompts" / "train.jsonl"
    assert f"{PY} -m train --lr 1e-06 --data {snap_copy} --estimator rft --loss pg --out " \
           f"{out.resolve()}/runs/rft/ckpt" in text.replace("1e-6", "1e-06")
    assert f"expect checkpoint: {out.resolve()}/runs/grpo/ckpt" in text
    assert not out.exists()  # a dry run creates nothing


def test_output_must_be_new_or_this_queues_own(tmp_path):
    suite = write_suite(tmp_path / "s.toml", TWO_RUNS)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "results.txt").write_text("someone else's")
    with pytest.raises(QueueError, match="not a queue directory"):
        run_queue(suite, busy, out=None)
    out = tmp_path / "q"
    run_queue(suite, out, out=None)
    other = write_suite(tmp_path / "s.toml", TWO_RUNS.replace("echo a-ran", "echo edited"))
    with pytest.raises(QueueError, match="differs from the suite this queue started with"):
        run_queue(other, out, out=None)
    write_suite(tmp_path / "s.toml", TWO_RUNS)
    with pytest.raises(QueueError, match="--set"):
        run_queue(suite, out, sets=["flag=/elsewhere"], out=None)


def test_snapshot_code_and_inputs_are_what_runs_use(tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("original\n")
    suite = write_suite(tmp_path / "s.toml", """
        [suite]
        name = "snap"
        [inputs]
        data = "%s"
        [[runs]]
        name = "where"
        commands = [["{python}", "-c", "import rlhf_ext, shutil; print('CODE', rlhf_ext.__file__); shutil.copy('{inputs.data}', '{run_dir}/seen.txt')"]]
        expect = ["{run_dir}/seen.txt"]
        [[runs]]
        name = "gate"
        commands = [["bash", "-c", "test -f {output}/go"]]
        expect = ["{output}/go"]
    """ % data)
    out = tmp_path / "q"
    data.write_text("original\n")
    assert run_queue(suite, out, out=None) == 1  # 'gate' fails: no go file
    m = manifest(out)
    where = runs_by_name(out)["where"]
    log = Path(where["logs"][0]).read_text()
    assert f"CODE {out.resolve()}/snapshot/code/rlhf_ext/__init__.py" in log
    assert (Path(where["run_dir"]) / "seen.txt").read_text() == "original\n"
    snap = m["snapshot"]
    assert where["sha256"]["inputs"]["data"] == snap["inputs"]["data"]["sha256"]
    assert where["sha256"]["code"] == snap["code"]["sha256"] and len(snap["code"]["sha256"]) == 64
    assert snap["versions"]["rlhf_ext"] and snap["versions"]["openrlhf"]
    assert m["suite"]["sha256"] == where["sha256"]["suite"]
    git = snap["git"]["cwd"] or snap["git"].get("rlhf_ext")
    assert git is None or (len(git["commit"]) == 40 and Path(git["diff"]).exists())
    # the workspace input changes: later runs still see the snapshot's copy
    data.write_text("edited\n")
    assert Path(snap["inputs"]["data"]["path"]).read_text() == "original\n"
    # the snapshot's code copy is tampered with: the queue refuses to go on
    (out / "snapshot" / "code" / "rlhf_ext" / "__init__.py").write_text("# edited\n")
    (out / "go").touch()
    with pytest.raises(QueueError, match="was modified"):
        run_queue(suite, out, retry_failed=True, out=None)


@pytest.mark.parametrize("body, message", [
    ('[suite]\nname="x"\n[[runs]]\nname="a"\ncommands=[["true"]]\n', "no 'expect'"),
    ('[suite]\nname="x"\n[[runs]]\nname="a"\nexpect=["f"]\n', "no 'commands'"),
    ('[suite]\nname="x"\n[[runs]]\nname="a"\ncommands=[["true"]]\nexpect=["f"]\n[[runs]]\nname="a"\n'
     'commands=[["true"]]\nexpect=["f"]\n', "duplicate run name"),
    ('[suite]\nname="x"\n[[runs]]\nname="a b"\ncommands=[["true"]]\nexpect=["f"]\n', "'name' must be"),
    ('[suite]\nname="x"\n[[runs]]\nname="a"\ncommands=[["true"]]\nexpect=["f"]\ntypo=1\n', "unknown key"),
    ('[suite]\nname="x"\n[vars]\nrun_dir="x"\n[[runs]]\nname="a"\ncommands=[["true"]]\nexpect=["f"]\n', "built-in"),
    ('[suite]\nname="x"\n', "at least one [[runs]]"),
    ('[suite\n', "not valid TOML"),
])  # fmt: skip
def test_bad_suites_are_named_errors(tmp_path, body, message):
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(SuiteError, match=__import__("re").escape(message)):
        load_suite(path)


def test_unknown_and_misused_variables(tmp_path):
    suite = write_suite(tmp_path / "s.toml", """
        [suite]
        name = "vars"
        [vars]
        lst = ["a", "b"]
        [[runs]]
        name = "a"
        commands = [["echo", "{nope}"]]
        expect = ["x"]
        [[runs]]
        name = "b"
        commands = [["echo", "x{lst}"]]
        expect = ["x"]
    """)
    with pytest.raises(SuiteError, match=r"unknown variable \{nope\}"):
        dry_run(suite, tmp_path / "q", only=["a"])
    with pytest.raises(SuiteError, match="list variable"):
        dry_run(suite, tmp_path / "q", only=["b"])
    with pytest.raises(SuiteError, match="unknown run"):
        dry_run(suite, tmp_path / "q", only=["zzz"])
    # JSON braces are not placeholders
    suite2 = write_suite(tmp_path / "s2.toml", """
        [suite]
        name = "json"
        [[runs]]
        name = "a"
        commands = [["echo", '{"env_vars": {"A": "1"}}', "{run}"]]
        expect = ["x"]
    """)
    assert dry_run(suite2, tmp_path / "q2") == 0
