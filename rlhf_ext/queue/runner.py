"""Running a suite: one run at a time, in order, stopping at the first failure.

Rules (docs/queue.md):

* the output directory is new (or empty), or the directory of this same queue, to continue it:
  runs already ``done`` are left alone, the queue resumes at the first run that is not;
* exactly one run executes at a time, and one runner per directory (:mod:`.lock`);
* a run whose command exits non-zero, or exits 0 without every path of its ``expect``, is
  ``failed`` with the reason, and the queue stops: later runs stay ``pending``;
* a ``failed`` / ``interrupted`` run is retried only with ``--retry-failed``; the previous
  attempt's directory is kept as ``runs/NAME.attempt<k>`` and its manifest entry under
  ``previous_attempts``, so a retry never overwrites results;
* SIGINT / SIGTERM (Ctrl-C, ``rlhf-ext queue stop``) stop the running command's whole process
  group and every process it started in other sessions (Ray's daemons;
  :class:`rlhf_ext.ground.supervision.ProcessTree`), mark the run ``interrupted`` and end the queue;
* each command runs in its own session, in the directory the queue was first started from, with
  ``DIR/snapshot/code`` first on ``PYTHONPATH`` and ``PYTHONSAFEPATH=1`` (so a checkout in the
  working directory cannot shadow the snapshot); with
  ``--ray-address`` it is submitted with ``ray job submit`` (the snapshot's rlhf_ext travels as a
  ``py_modules`` entry of the job's runtime environment) and followed to completion; the run
  counts as succeeded only if Ray reports the job ``SUCCEEDED``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional, Sequence, TextIO

from rlhf_ext.ground.supervision import ProcessTree

from . import manifest as mf
from .lock import QueueLock, QueueLockedError
from .manifest import DONE, FAILED, INTERRUPTED, PENDING, RUNNING, Manifest, ManifestError
from .snapshot import sha256_file, sha256_tree, package_dir, take_snapshot, verify_code
from .suite import SuiteError, load_suite, parse_sets, resolve_inputs, resolve_run

KILL_GRACE_S = 10.0
POLL_S = 0.25
TREE_EVERY_S = 1.0
EXIT_INTERRUPTED = 130


class QueueError(RuntimeError):
    """A queue that cannot start or continue; the message says why and what to do."""


class _Stop:
    """Set by SIGINT / SIGTERM; the runner checks it between polls."""

    def __init__(self):
        self.signum: Optional[int] = None

    def __call__(self, signum, frame):
        if self.signum is None:
            self.signum = signum

    @property
    def name(self) -> Optional[str]:
        return signal.Signals(self.signum).name if self.signum else None


def _say(out: Optional[TextIO], text: str) -> None:
    if out is not None:
        print(text, file=out, flush=True)


def _fmt_cmd(cmd: Sequence[str]) -> str:
    return shlex.join(cmd)


def _missing(expect: Dict[str, List[str]]) -> List[str]:
    """Expected paths that do not exist (an empty directory counts as missing)."""
    out = []
    for kind, paths in expect.items():
        for p in paths:
            path = Path(p)
            if not path.exists() or (path.is_dir() and not any(path.iterdir())) or (
                    path.is_file() and path.stat().st_size == 0):
                out.append(f"{kind} {p}")
    return out


def _is_queue_dir(output: Path) -> bool:
    return (output / mf.MANIFEST).is_file()


def _is_fresh(output: Path) -> bool:
    """Empty, or left by a start that died before its manifest was written (only the lock and snapshot)."""
    return not output.exists() or {p.name for p in output.iterdir()} <= {"queue.lock", "snapshot"}


# --- dry run ---------------------------------------------------------------------------------------------


def dry_run(suite_path, output, *, sets: Optional[Sequence[str]] = None, only: Optional[Sequence[str]] = None,
            ray_address: Optional[str] = None, out=None) -> int:
    """Print every command with its resolved paths (to ``out``, default stdout) and check that the inputs
    exist; touch nothing. Returns 0, or 1 when an input is missing or the output directory is taken."""
    out = sys.stdout if out is None else out
    suite = load_suite(suite_path)
    set_values = parse_sets(sets)
    output = Path(output).resolve()
    inputs = resolve_inputs(suite, set_values, output=output, cwd=Path.cwd())
    problems = []
    _say(out, f"suite {suite.name} ({suite.path}) -> {output}")
    if not _is_fresh(output) and not _is_queue_dir(output):
        problems.append(f"output directory {output} exists, is not empty and is not a queue directory")
    elif _is_queue_dir(output):
        _say(out, "  (existing queue: 'rlhf-ext queue run' would continue it; done runs are skipped)")
    snap = output / "snapshot"
    _say(out, "inputs (copied into the snapshot at start):")
    snap_inputs = {}
    for name, src in inputs.items():
        ok = Path(src).is_file()
        if not ok:
            problems.append(f"input {name!r}: {src} does not exist")
        snap_inputs[name] = str(snap / "inputs" / name / Path(src).name)
        _say(out, f"  {name}: {src} [{'ok' if ok else 'MISSING'}] -> {snap_inputs[name]}")
    for i, spec in enumerate(suite.select(only), 1):
        run = resolve_run(suite, spec, set_values, output=output, snapshot=snap, inputs=snap_inputs)
        _say(out, f"\n[{i}] {run.name}  (run directory {run.run_dir})")
        for j, cmd in enumerate(run.commands, 1):
            shown = _ray_submit_cmd(cmd, ray_address, "<id>", snap, run.env) if ray_address else cmd
            _say(out, f"  command {j}: {_fmt_cmd(shown)}")
        if run.env:
            _say(out, f"  env: {' '.join(f'{k}={v}' for k, v in run.env.items())}")
        for kind, paths in run.expect.items():
            for p in paths:
                _say(out, f"  expect {kind}: {p}")
    if problems:
        for p in problems:
            _say(out, f"error: {p}")
        return 1
    _say(out, "\ndry run: all inputs exist")
    return 0


# --- starting / continuing -------------------------------------------------------------------------------


def _prepare(suite_path: Path, output: Path, set_values: Dict[str, str], only: Optional[List[str]],
             out: Optional[TextIO]) -> Manifest:
    """Create the queue (snapshot + manifest) or open the existing one; called with the lock held."""
    suite_sha = sha256_file(suite_path)
    if _is_queue_dir(output):
        m = Manifest.open(output)
        if m.data["suite"]["sha256"] != suite_sha:
            raise QueueError(
                f"{suite_path} differs from the suite this queue started with ({m.data['suite']['snapshot']}); "
                "a queue runs one suite: use a new --output directory, or restore the suite file"
            )
        if set_values and set_values != m.data["sets"]:
            raise QueueError(f"--set {set_values} differs from this queue's {m.data['sets']}; omit --set to continue")
        if only and list(only) != m.data["only"]:
            raise QueueError(f"--only {only} differs from this queue's {m.data['only']}; omit --only to continue")
        problem = verify_code(m.data["snapshot"])
        if problem:
            raise QueueError(f"cannot continue: {problem}")
        _say(out, f"continuing queue {m.data['suite']['name']} in {output}")
        return m

    suite = load_suite(suite_path)
    selected = suite.select(only)
    inputs = resolve_inputs(suite, set_values, output=output, cwd=Path.cwd())
    snap_dir = output / "snapshot"
    if snap_dir.exists():  # a previous start died between snapshot and manifest: take it again
        shutil.rmtree(snap_dir)
    try:
        record = take_snapshot(snap_dir, suite_path=suite_path, inputs=inputs, cwd=Path.cwd())
    except FileNotFoundError as exc:
        shutil.rmtree(snap_dir, ignore_errors=True)
        raise QueueError(str(exc)) from None
    snap_inputs = {k: v["path"] for k, v in record["inputs"].items()}
    m = Manifest.create(
        output,
        suite={"name": suite.name, "source": str(suite_path.resolve()), "snapshot": record["suite"]["path"],
               "sha256": suite_sha},
        sets=set_values,
        only=list(only) if only else None,
        cwd=str(Path.cwd()),
        snapshot=record,
    )
    sha = {"code": record["code"]["sha256"], "suite": suite_sha,
           "inputs": {k: v["sha256"] for k, v in record["inputs"].items()}}
    for spec in selected:
        run = resolve_run(suite, spec, set_values, output=output, snapshot=snap_dir, inputs=snap_inputs)
        m.runs.append(mf.new_run_entry(run.name, commands=run.commands, expect=run.expect, run_dir=run.run_dir,
                                       record_dir=run.record_dir, sha256=sha))
        m.runs[-1]["env"] = run.env
        if spec.group:
            m.runs[-1]["seed_group"] = spec.group
    m.save()
    here = sha256_tree(package_dir())
    if here != record["code"]["sha256"]:  # cannot happen at creation; kept as an invariant
        raise QueueError("the rlhf_ext snapshot differs from the package it was copied from")
    _say(out, f"new queue {suite.name} in {output}: {len(selected)} run(s); snapshot in {snap_dir}")
    return m


def _note_workspace_drift(m: Manifest, out: Optional[TextIO]) -> None:
    try:
        here = sha256_tree(package_dir())
    except OSError:
        return
    if here != m.data["snapshot"]["code"]["sha256"]:
        _say(out, f"note: the rlhf_ext in {package_dir()} changed since the queue started; the runs use the "
                  f"snapshot in {m.data['snapshot']['code']['path']}")


# --- one command ----------------------------------------------------------------------------------------


def _ray_cli() -> str:
    """The ``ray`` command of this interpreter's environment (a venv's bin/ need not be on PATH)."""
    return shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray") or "ray"


def _ray_submit_cmd(cmd: List[str], address: str, submission_id: str, snap: Path, env: Dict[str, str]) -> List[str]:
    # PYTHONSAFEPATH: the job's working directory must not shadow the snapshot (see Runner.env_for)
    runtime_env = {"py_modules": [str(snap / "code" / "rlhf_ext")], "env_vars": {"PYTHONSAFEPATH": "1", **env}}
    return [_ray_cli(), "job", "submit", "--address", address, "--submission-id", submission_id,
            "--runtime-env-json", json.dumps(runtime_env), "--", *cmd]


def _ray_job_status(address: str, submission_id: str) -> Optional[str]:
    try:
        from ray.job_submission import JobSubmissionClient

        return str(JobSubmissionClient(address).get_job_status(submission_id).value)
    except Exception as exc:  # the cluster is gone, or the job was never created
        return f"unknown ({type(exc).__name__}: {exc})"


def _ray_stop(address: str, submission_id: str) -> None:
    try:
        subprocess.run([_ray_cli(), "job", "stop", "--address", address, submission_id], timeout=120,
                       capture_output=True)
    except (OSError, subprocess.TimeoutExpired):
        pass


def _kill(proc: subprocess.Popen, tree: ProcessTree, grace: float) -> None:
    """SIGTERM the command's process group, SIGKILL it after ``grace``; then every known descendant."""
    tree.snapshot()
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    tree.kill_all(grace=grace)


class Runner:
    def __init__(self, output: Path, m: Manifest, *, ray_address: Optional[str], out: Optional[TextIO],
                 stop: _Stop, kill_grace: float = KILL_GRACE_S):
        self.output = output
        self.m = m
        self.ray_address = ray_address
        self.out = out
        self.stop = stop
        self.kill_grace = kill_grace
        self.snap = output / "snapshot"

    def env_for(self, entry: Dict) -> Dict[str, str]:
        env = dict(os.environ)
        code = str(self.snap / "code")
        env["PYTHONPATH"] = code + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        # Python puts the working directory (or a script's directory) before PYTHONPATH; started in a
        # checkout, that would import the checkout's rlhf_ext, not the snapshot (Python >= 3.11).
        env["PYTHONSAFEPATH"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        env["RLHF_EXT_QUEUE_DIR"] = str(self.output)
        env["RLHF_EXT_QUEUE_RUN"] = entry["name"]
        env.update(entry.get("env") or {})
        return env

    def run_command(self, entry: Dict, index: int, cmd: List[str]) -> Dict:
        """Run one command to its end (or the stop signal); returns {exit_code, signal, interrupted}."""
        logs = Path(entry["run_dir"]) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"{index + 1}-{Path(cmd[0]).name}.log"
        submission_id = None
        argv = cmd
        if self.ray_address:
            submission_id = f"{self.m.data['suite']['name']}-{entry['name']}-a{entry['attempt']}-c{index + 1}-" \
                            f"{uuid.uuid4().hex[:6]}"
            argv = _ray_submit_cmd(cmd, self.ray_address, submission_id, self.snap, entry.get("env") or {})
        with open(log_path, "ab") as log:
            log.write(f"# rlhf-ext queue: {_fmt_cmd(argv)}\n".encode())
            log.flush()
            try:
                proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env=self.env_for(entry), cwd=self.m.data["cwd"], start_new_session=True)
            except OSError as exc:
                entry["logs"].append(str(log_path))
                return {"exit_code": None, "signal": None, "interrupted": False,
                        "error": f"command {index + 1} could not start: {exc}"}
        entry.update(command_index=index, pid=proc.pid, pgid=proc.pid, ray_submission_id=submission_id)
        entry["logs"].append(str(log_path))
        self.m.save()
        _say(self.out, f"  command {index + 1}/{len(entry['commands'])} pid {proc.pid}, log {log_path}")
        tree = ProcessTree(proc.pid)
        last_tree = 0.0
        while proc.poll() is None:
            if self.stop.signum is not None:
                if submission_id:
                    _ray_stop(self.ray_address, submission_id)
                _kill(proc, tree, self.kill_grace)
                return {"exit_code": None, "signal": self.stop.name, "interrupted": True}
            now = time.monotonic()
            if now - last_tree >= TREE_EVERY_S:
                tree.snapshot()
                last_tree = now
            time.sleep(POLL_S)
        rc = proc.returncode
        # Whatever the command left behind in other sessions (a Ray daemon after a crash) goes too.
        tree.kill_all(grace=min(self.kill_grace, 5.0))
        result = {"exit_code": rc if rc >= 0 else None,
                  "signal": signal.Signals(-rc).name if rc < 0 else None, "interrupted": False}
        if submission_id and rc == 0:
            status = _ray_job_status(self.ray_address, submission_id)
            result["ray_status"] = status
            if status != "SUCCEEDED":
                result["error"] = f"Ray job {submission_id} ended {status}"
        return result

    def _guard_incident(self, entry: Dict, exit_code: Optional[int]) -> Optional[str]:
        """A short description of the guard's incident when the run's record says the guard stopped it
        (end event ``stopped_by_guard`` with this exit code, and ``incident.json``), else None. The exit
        code alone is not enough: any command may exit with 3."""
        from rlhf_ext import runs

        record = entry.get("record_dir")
        if not record or exit_code is None:
            return None
        path = Path(record)
        if not path.is_absolute():
            path = Path(self.m.data["cwd"]) / path
        try:
            status, code = runs.run_status(runs.read_jsonl(path / runs.EVENTS))
            inc = json.loads((path / runs.INCIDENT).read_text())
        except (OSError, ValueError):
            return None
        if status != "stopped_by_guard" or code != exit_code or not isinstance(inc, dict):
            return None
        origin = inc.get("origin") if isinstance(inc.get("origin"), dict) else {}
        source = f" (from {origin['name']})" if origin.get("name") else ""
        return (f"non-finite {inc.get('tensor')}{source} at step {inc.get('step')}, rank {inc.get('rank')}; "
                f"see {path / runs.INCIDENT}")

    def execute(self, entry: Dict) -> str:
        entry.update(status=RUNNING, reason=None, failure=None, attempt=entry["attempt"] + 1, started_at=time.time(),
                     ended_at=None, exit_code=None, signal=None, logs=[], missing=[], command_index=None)
        self.m.data["status"] = "running"
        self.m.save()
        for index, cmd in enumerate(entry["commands"]):
            if self.stop.signum is not None:  # stopped between two commands of the run
                entry.update(status=INTERRUPTED, signal=self.stop.name, ended_at=time.time(),
                             reason=f"stopped by {self.stop.name} before command {index + 1}")
                self.m.save()
                return INTERRUPTED
            res = self.run_command(entry, index, cmd)
            entry.update(exit_code=res["exit_code"], signal=res["signal"], ended_at=time.time())
            if "ray_status" in res:
                entry["ray_status"] = res["ray_status"]
            if res["interrupted"]:
                entry.update(status=INTERRUPTED, reason=f"stopped by {res['signal']} during command {index + 1}")
                self.m.save()
                return INTERRUPTED
            if res.get("error") or res["exit_code"] != 0:
                why = res.get("error") or (f"command {index + 1} exited with code {res['exit_code']}"
                                           if res["exit_code"] is not None
                                           else f"command {index + 1} was killed by {res['signal']}")
                incident = None if res.get("error") else self._guard_incident(entry, res["exit_code"])
                if incident:
                    why = (f"command {index + 1} was stopped by the non-finite guard (exit code {res['exit_code']}): "
                           f"{incident}")
                entry.update(status=FAILED, reason=why, failure="guard" if incident else None)
                self.m.save()
                return FAILED
            self.m.save()
        missing = _missing(entry["expect"])
        entry["missing"] = missing
        entry["ended_at"] = time.time()
        if missing:
            entry.update(status=FAILED, reason="exited 0 but missing: " + "; ".join(missing))
        else:
            entry.update(status=DONE, reason=None)
        self.m.save()
        return entry["status"]


def _archive_attempt(entry: Dict) -> None:
    """Keep a failed attempt: its manifest fields and its directory (renamed), so a retry overwrites nothing."""
    kept = {k: entry.get(k) for k in ("attempt", "status", "reason", "failure", "started_at", "ended_at", "exit_code",
                                      "signal", "logs", "missing", "pid", "ray_submission_id")}
    run_dir = Path(entry["run_dir"])
    if run_dir.exists():
        target = run_dir.with_name(f"{run_dir.name}.attempt{entry['attempt']}")
        n = 1
        while target.exists():
            target = run_dir.with_name(f"{run_dir.name}.attempt{entry['attempt']}.{n}")
            n += 1
        run_dir.rename(target)
        kept["moved_to"] = str(target)
    entry["previous_attempts"].append(kept)
    entry.update(status=PENDING, reason=None)


def run_queue(suite_path, output, *, sets: Optional[Sequence[str]] = None, only: Optional[Sequence[str]] = None,
              retry_failed: bool = False, ray_address: Optional[str] = None, out="stdout",
              kill_grace: float = KILL_GRACE_S) -> int:
    """Run (or continue) the queue; returns 0 when every run is done, 1 on a failure, 130 when stopped.

    Progress goes to ``out`` (default stdout; None for silence).

    Raises :class:`QueueError` / :class:`rlhf_ext.queue.suite.SuiteError` for a queue that cannot start.
    """
    out = sys.stdout if out == "stdout" else out
    suite_path = Path(suite_path)
    output = Path(output).resolve()
    set_values = parse_sets(sets)
    only = list(only) if only else None
    load_suite(suite_path)  # a broken suite is reported before anything is created
    if output.exists() and not output.is_dir():
        raise QueueError(f"--output {output} exists and is not a directory")
    if not _is_fresh(output) and not _is_queue_dir(output):
        raise QueueError(f"--output {output} exists and is not a queue directory (no {mf.MANIFEST}); a queue "
                         "needs a new directory, or its own directory to continue")
    output.mkdir(parents=True, exist_ok=True)
    lock = QueueLock(output)
    lock.acquire()
    stop = _Stop()
    old_handlers = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        m = _prepare(suite_path, output, set_values, only, out)
        m.data["runner"] = {"pid": os.getpid(), "started_at": time.time(), "ray_address": ray_address,
                            "argv": sys.argv}
        for entry in m.runs:
            if entry["status"] == RUNNING:  # its runner died without recording the end
                entry.update(status=INTERRUPTED, reason="the queue runner ended without recording this run's end "
                                                         "(killed?)", ended_at=entry.get("ended_at") or time.time())
        m.save()
        _note_workspace_drift(m, out)
        runner = Runner(output, m, ray_address=ray_address, out=out, stop=stop, kill_grace=kill_grace)
        total = len(m.runs)
        for i, entry in enumerate(m.runs, 1):
            if stop.signum is not None:
                break
            if entry["status"] == DONE:
                _say(out, f"[{i}/{total}] {entry['name']}: done already, skipped")
                continue
            if entry["status"] in (FAILED, INTERRUPTED):
                if not retry_failed:
                    m.data["status"] = "failed"
                    m.save()
                    _say(out, f"[{i}/{total}] {entry['name']}: {entry['status']} earlier ({entry['reason']}); the "
                              "queue stops here. Rerun with --retry-failed to run it again.")
                    return 1
                _archive_attempt(entry)
                m.save()
            problem = verify_code(m.data["snapshot"])
            if problem:
                entry.update(status=FAILED, reason=f"not started: {problem}")
                m.data["status"] = "failed"
                m.save()
                _say(out, f"[{i}/{total}] {entry['name']}: {entry['reason']}")
                return 1
            _say(out, f"[{i}/{total}] {entry['name']}: running")
            status = runner.execute(entry)
            took = (entry["ended_at"] or time.time()) - entry["started_at"]
            _say(out, f"[{i}/{total}] {entry['name']}: {status} after {took:.0f} s"
                      + (f" -- {entry['reason']}" if entry["reason"] else ""))
            if status == INTERRUPTED:
                m.data["status"] = "interrupted"
                m.save()
                return EXIT_INTERRUPTED
            if status == FAILED:
                m.data["status"] = "failed"
                m.save()
                _say(out, "queue stopped at the first failure; later runs were not started")
                return 1
        if stop.signum is not None:
            m.data["status"] = "interrupted"
            m.save()
            return EXIT_INTERRUPTED
        m.data["status"] = "finished"
        m.save()
        _say(out, f"queue finished: {total} run(s) done")
        return 0
    finally:
        for s, h in old_handlers.items():
            signal.signal(s, h)
        lock.release()


__all__ = ["EXIT_INTERRUPTED", "QueueError", "QueueLockedError", "ManifestError", "SuiteError", "dry_run",
           "run_queue"]
