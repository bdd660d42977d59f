"""Two Ray nodes on one machine: the plugin on every node, one run record, the HTTP reward server.

What is here:

* unit tests of the node check (``rlhf_ext.patches.openrlhf.node_check``): the probe a node runs,
  the one-line verdict, what the driver expects every node to see;
* the bad input, for real: a two-node cluster whose second node runs a Python environment without
  rlhf_ext, and the unmodified ``train_ppo_ray --plugin rlhf_ext`` joining it: one line naming that
  node and the cause, exit code 2, before any model loads, nothing left running;
* helpers for the lead's mode matrix (one real two-node run): :func:`two_node_cluster` (two
  ``ray start --block`` processes with their own custom resources and one CPU each, so OpenRLHF's two
  placement groups on the CPU target -- actor + reference, and the vLLM engine -- land one on each
  node), :func:`reward_server` (``rlhf-ext reward-server`` on 127.0.0.1), :func:`two_node_run` and
  :func:`check_two_node_run`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, Iterator, List, Optional, Sequence

import pytest

from rlhf_ext.patches.openrlhf import node_check as nc

# --- helpers for real clusters (also used by the lead's mode matrix) ----------------------------

HEAD_RESOURCE = "rlhf_ext_test_node_1"
WORKER_RESOURCE = "rlhf_ext_test_node_2"
OPENRLHF_ACTORS = ("PPOTrainer", "PolicyModelActor", "ReferenceModelActor", "RolloutRayActor")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def python_without_rlhf_ext(root: Path, python: str = sys.executable) -> str:
    """A virtual environment holding every package of ``python``'s environment except rlhf_ext (its
    package, editable finder, dist-info and start-up hook): a node whose Python lacks the plugin.
    Symlinks, built in well under a second; returns its interpreter."""
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    subprocess.run([python, "-m", "venv", "--without-pip", str(root)], check=True)
    target = Path(subprocess.run([str(root / "bin" / "python"), "-c",
                                  "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip())
    for entry in site.iterdir():
        if entry.name.startswith(("rlhf_ext", "__editable__.rlhf_ext", "__editable___rlhf_ext")):
            continue
        if not (target / entry.name).exists():
            (target / entry.name).symlink_to(entry)
    return str(root / "bin" / "python")


@dataclass
class TwoNodeCluster:
    address: str  # 127.0.0.1:PORT, for RAY_ADDRESS
    temp_dirs: List[str]  # one per node, as on two machines (each node's log monitor reads its own)
    env: Dict[str, str]  # the nodes' environment (no RLHF_EXT_* variable: the job must carry the plugin)
    logs: List[Path] = field(default_factory=list)
    python: str = sys.executable

    def placement(self, timeout: float = 120) -> dict:
        """The cluster's nodes and every actor it ran (alive or dead), from Ray's GCS, through a short driver.

        ``{"nodes": [{"node_id", "head", "resources"}], "actors": [{"class_name", "pid", "node_id", "state"}]}``
        """
        script = textwrap.dedent("""
            import json, sys, ray
            ray.init(address=sys.argv[1], log_to_driver=False)
            nodes = [{"node_id": n["NodeID"], "alive": n["Alive"], "head": "node:__internal_head__" in n["Resources"],
                      "resources": sorted(k for k in n["Resources"] if k.startswith("rlhf_ext_test"))}
                     for n in ray.nodes()]
            actors = [{"class_name": a.get("ActorClassName") or a.get("class_name"), "pid": a.get("Pid"),
                       "node_id": (a.get("Address") or {}).get("NodeID"), "state": a.get("State")}
                      for a in ray._private.state.actors().values()]
            ray.shutdown()
            print("PLACEMENT " + json.dumps({"nodes": nodes, "actors": actors}))
        """)
        env = {k: v for k, v in self.env.items() if not k.startswith("RLHF_EXT_")}
        out = subprocess.run([self.python, "-c", script, self.address], capture_output=True, text=True, env=env,
                             timeout=timeout, cwd=self.temp_dirs[0])
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("PLACEMENT ")), None)
        assert line, out.stdout[-2000:] + out.stderr[-4000:]
        return json.loads(line[len("PLACEMENT "):])

    def processes(self) -> List[int]:
        """Pids of the processes whose command line names a temp dir of this cluster (its Ray daemons and workers)."""
        import psutil

        pids = []
        for proc in psutil.process_iter(["cmdline"]):
            try:
                cmdline = " ".join(proc.info["cmdline"] or [])
                if any(temp_dir in cmdline for temp_dir in self.temp_dirs):
                    pids.append(proc.pid)
            except psutil.Error:
                continue
        return pids


def _wait_for_line(path: Path, needle: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        if needle in text:
            return
        if proc.poll() is not None:
            raise RuntimeError(f"`ray start` exited with {proc.returncode}:\n{text[-3000:]}")
        time.sleep(0.5)
    raise TimeoutError(f"`ray start` did not report {needle!r} within {timeout:.0f} s ({path})")


@contextlib.contextmanager
def two_node_cluster(tmp_path: Path, *, worker_python: Optional[str] = None, cpus: Sequence[int] = (1, 1),
                     start_timeout: float = 180) -> Iterator[TwoNodeCluster]:
    """Two Ray nodes on this machine: ``ray start --head`` and ``ray start --address 127.0.0.1:PORT``,
    each ``--block`` (it stops its own daemons when signalled), with one CPU each by default and a
    custom resource naming it (``rlhf_ext_test_node_1`` / ``_2``). The second node runs
    ``worker_python`` (default: this interpreter), the way a node with its own environment does.

    Started from :func:`rlhf_ext.tours.smoke.train_env` without the ``RLHF_EXT_*`` variables, like a
    long-running cluster: the plugin must reach the workers through the job. Ray records the nodes
    under the machine's routable address (``ray start`` turns 127.0.0.1 into it,
    ``ray/_private/services.py: resolve_ip_for_localhost``); every address this helper hands out is
    127.0.0.1. On exit both nodes are stopped (SIGTERM, then SIGKILL of every process of the
    cluster) even when the body failed, and the temp dirs are removed.
    """
    from rlhf_ext.ground.supervision import ProcessTree
    from rlhf_ext.tours.smoke import train_env

    # short: Ray puts AF_UNIX sockets (107 bytes at most) under the session directory in here. One per
    # node: a log monitor reads every worker log under its node's temp dir, so with one shared dir each
    # line of every worker reached the driver twice
    temp_dirs = [tempfile.mkdtemp(prefix=f"r2n{i}", dir="/tmp") for i in (1, 2)]
    env = {k: v for k, v in train_env().items() if not k.startswith("RLHF_EXT_") and k != "PYTHONPATH"}
    port = _free_port()
    common = ["--block", "--disable-usage-stats", "--object-store-memory", str(256 << 20)]
    cluster = TwoNodeCluster(address=f"127.0.0.1:{port}", temp_dirs=temp_dirs, env=env)
    procs: List[subprocess.Popen] = []
    trees: List[ProcessTree] = []
    try:
        for i, (python, role) in enumerate(((sys.executable, ["--head", "--port", str(port), "--include-dashboard",
                                                              "false"]),
                                            (worker_python or sys.executable, ["--address", cluster.address]))):
            log = Path(tmp_path) / f"ray_node_{i + 1}.log"
            cluster.logs.append(log)
            resources = json.dumps({HEAD_RESOURCE if i == 0 else WORKER_RESOURCE: 1})
            with open(log, "w") as out:
                # cwd: the temp dir, so the raylet's workers do not find this checkout on their path
                proc = subprocess.Popen([python, "-m", "ray.scripts.scripts", "start", *role, "--num-cpus",
                                         str(cpus[i]), "--resources", resources, f"--temp-dir={temp_dirs[i]}",
                                         *common], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=temp_dirs[i],
                                        start_new_session=True)
            procs.append(proc)
            trees.append(ProcessTree(proc.pid))
            _wait_for_line(log, "Ray runtime started", proc, start_timeout)
        yield cluster
    finally:
        for tree in trees:
            tree.snapshot()
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for tree in trees:
            tree.kill_all(grace=5)
        _kill_pids(cluster.processes())
        for temp_dir in temp_dirs:
            shutil.rmtree(temp_dir, ignore_errors=True)


def _kill_pids(pids: Sequence[int]) -> None:
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
            procs[-1].kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=30)


@contextlib.contextmanager
def reward_server(tmp_path: Path, *, reward: str = "math", workers: int = 1,
                  timeout: float = 120) -> Iterator[SimpleNamespace]:
    """``rlhf-ext reward-server`` on 127.0.0.1 (a free port), as a separate process, the way a user
    starts it for the rollout actors of every node; yields ``url`` (``.../get_reward``) and
    ``health()``. Stopped with SIGTERM (graceful), then killed, whatever happened."""
    log = Path(tmp_path) / "reward_server.log"
    out = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "rlhf_ext.cli", "reward-server", "--host", "127.0.0.1", "--port",
                             "0", "--workers", str(workers), "--reward", reward], stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        deadline, base = time.monotonic() + timeout, None
        while base is None and time.monotonic() < deadline:
            found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", log.read_text())
            if found:
                base = found.group(1)
            elif proc.poll() is not None:
                raise RuntimeError(f"reward server exited with {proc.returncode}: {log.read_text()[-2000:]}")
            else:
                time.sleep(0.2)
        assert base, f"reward server not listening after {timeout:.0f} s: {log.read_text()[-2000:]}"

        def health() -> dict:
            from urllib.request import urlopen

            with urlopen(base + "/health", timeout=30) as resp:
                return json.loads(resp.read())

        yield SimpleNamespace(url=base + "/get_reward", health=health, log=log, pid=proc.pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        out.close()


def replace_flag(cmd: Sequence[str], flag: str, *values: str) -> List[str]:
    """``cmd`` with ``flag``'s values replaced (appended when absent)."""
    cmd = list(cmd)
    if flag not in cmd:
        return cmd + [flag, *values]
    i = cmd.index(flag)
    j = i + 1
    while j < len(cmd) and not cmd[j].startswith("--"):
        j += 1
    return cmd[:i] + [flag, *values] + cmd[j:]


TWO_NODE_STEPS = 2


def two_node_command(work: Path, task: Path, reward_url: str, *, steps: int = TWO_NODE_STEPS,
                     extra: Sequence[str] = ()) -> List[str]:
    """The smoke tour's ``train_ppo_ray`` command (4 prompts x 4 samples, ``steps`` steps), its reward
    from the HTTP server at ``reward_url``, plus ``extra`` flags (a flag given there replaces the
    smoke command's value)."""
    from rlhf_ext.tours.smoke import train_command

    cmd = train_command(model=task / "model", prompts=task / "train.jsonl", output=work / "trained",
                        estimator="grpo", steps=steps, prompts_per_step=4, n_samples=4, lr=5e-4)
    cmd = replace_flag(cmd, "--reward.remote_url", reward_url)
    extra = list(extra)
    i = 0
    while i < len(extra):
        j = i + 1
        while j < len(extra) and not extra[j].startswith("--"):
            j += 1
        cmd = replace_flag(cmd, extra[i], *extra[i + 1:j])
        i = j
    return cmd


def two_node_run(work: Path, task: Path, *, steps: int = TWO_NODE_STEPS, extra: Sequence[str] = (),
                 timeout: float = 900) -> SimpleNamespace:
    """One real run of ``train_ppo_ray --plugin rlhf_ext`` (CPU target) on :func:`two_node_cluster` with
    its reward from :func:`reward_server`; returns ``rc``, ``text`` (console), ``placement`` (nodes and
    actors, read from Ray while the cluster still runs), ``health`` (the reward server's counters after
    the run), ``cmd``, ``wall_s``, and ``left`` (processes of the cluster still alive after it stopped:
    must be ``[]``). Feed it to :func:`check_two_node_run`."""
    from rlhf_ext.tours.smoke import run_training

    work.mkdir(parents=True, exist_ok=True)
    with reward_server(work) as server, two_node_cluster(work) as cluster:
        cmd = two_node_command(work, task, server.url, steps=steps, extra=extra)
        started = time.monotonic()
        rc = run_training(cmd, work / "train.log", timeout=timeout, echo=False, cwd=work,
                          env={"RAY_ADDRESS": cluster.address})
        wall = time.monotonic() - started
        placement = cluster.placement()
        health = server.health()
    return SimpleNamespace(rc=rc, text=(work / "train.log").read_text(), placement=placement, health=health,
                           cmd=cmd, wall_s=wall, left=cluster.processes())


def check_two_node_run(work: Path, rc: int, text: str, *, placement: dict, health: dict,
                       steps: Optional[int] = TWO_NODE_STEPS, left: Sequence[int] = (),
                       estimator: Optional[str] = None, task: Optional[Path] = None,
                       dynamic_filtering: bool = False, max_epochs: Optional[int] = None) -> dict:
    """Assertions on a two-node run (:func:`two_node_run`); returns what they found, for a report.

    * it trained: exit 0, one OpenRLHF metrics line per step;
    * OpenRLHF's actors ran on both nodes (Ray's GCS), and every actor process, those on the second
      node included, logged the plugin's activation line; so did vLLM's engine processes;
    * the node check ran and recorded both nodes in ``config.json`` (``cluster``), each with this
      rlhf_ext and the reward server reachable;
    * the run record was written once: one ``start`` event, by the PPOTrainer actor's process, naming
      that actor's Ray node; one metrics line per step; an ``end`` event ``finished``;
    * the HTTP reward server answered the rollouts (its ``served`` counter) and the steps' rewards are
      its scores (``score`` within [0, 1]);
    * the weights changed; nothing of the cluster is left running;
    * with ``dynamic_filtering``: OpenRLHF's ``dynamic_filtering_pass_rate`` on every step (the number of
      steps then depends on how many groups were filtered: ``steps=None`` accepts any number >= 1);
      with ``max_epochs``: ``config.json`` has it and every step ran that many optimizer updates
      (``rlhf_ext/updates_attempted``; one train batch per rollout batch).
    """
    from rlhf_ext import __version__, runs
    from rlhf_ext.tours.smoke import parse_train_log, run_record_dir, weights_changed

    assert rc == 0, text[-6000:]
    log = parse_train_log(text)
    assert len(log.steps) == steps if steps is not None else len(log.steps) >= 1, [s.get("global_step")
                                                                                    for s in log.steps]
    steps = len(log.steps)
    missing = log.processes_without_plugin()
    assert not missing, f"processes without the plugin's activation line: {missing}"

    nodes = {n["node_id"]: n for n in placement["nodes"]}
    assert len(nodes) == 2 and sorted(r for n in nodes.values() for r in n["resources"]) == [HEAD_RESOURCE,
                                                                                            WORKER_RESOURCE], nodes
    actors = [a for a in placement["actors"] if a["class_name"] in OPENRLHF_ACTORS]
    assert {a["class_name"] for a in actors} == set(OPENRLHF_ACTORS), actors
    used = {a["node_id"] for a in actors}
    assert used == set(nodes), f"OpenRLHF's actors ran on {len(used)} of the 2 nodes: {actors}"
    worker_node = next(i for i, n in nodes.items() if WORKER_RESOURCE in n["resources"])
    on_worker = [a for a in actors if a["node_id"] == worker_node]
    assert on_worker and all(a["pid"] in log.activations for a in on_worker), (on_worker, log.activations)
    assert log.actor_pids.get("EngineCore"), "vLLM's engine core process logged nothing"

    record = run_record_dir(work / "trained")
    config = json.loads((record / runs.CONFIG).read_text())
    cluster = config["cluster"]
    assert {n["node_id"] for n in cluster["nodes"]} == set(nodes), cluster
    assert all(n["rlhf_ext"] == __version__ and "rlhf_ext" in n["active"] and n["reward_endpoints_reachable"]
               for n in cluster["nodes"]), cluster
    assert "rlhf_ext: the plugin is ready on all 2 Ray nodes" in text
    events = runs.read_jsonl(record / runs.EVENTS)
    starts = [e for e in events if e["event"] == "start"]
    assert len(starts) == 1, events
    trainer = next(a for a in actors if a["class_name"] == "PPOTrainer")
    assert starts[0]["node_id"] == trainer["node_id"] and starts[0]["pid"] == trainer["pid"], (starts, trainer)
    assert [e["status"] for e in events if e["event"] == "end"] == ["finished"], events
    metrics = runs.read_metrics(record / runs.METRICS)
    assert [m["step"] for m in metrics] == list(range(1, steps + 1)), metrics
    if estimator is not None:
        assert config["args"]["algo.advantage.estimator"] == estimator
    if dynamic_filtering:
        assert config["args"]["algo.dynamic_filtering_enable"] is True
        assert all("dynamic_filtering_pass_rate" in s for s in log.steps), log.steps
    if max_epochs is not None:
        # a full rollout batch is one train batch: max_epochs optimizer steps. With dynamic filtering the
        # last batch may be short of --train.batch_size; OpenRLHF then runs no optimizer step on it
        assert config["args"]["train.max_epochs"] == max_epochs
        full = [m for m in metrics if m["rollout/num_samples"] >= config["args"]["train.batch_size"]]
        assert full and all(m["rlhf_ext/updates_attempted"] == max_epochs for m in full), metrics

    assert health["served"] >= steps and health["status"] == "ok", health
    scores = log.metric("score")
    assert len(scores) == steps and all(0.0 <= s <= 1.0 for s in scores), scores
    changed = {}
    if task is not None:
        changed = weights_changed(task / "model", work / "trained")
        assert max(changed.values()) > 0, "no weight moved"
    assert list(left) == [], f"processes of the cluster still alive: {left}"
    return {"steps": steps, "pass_rates": log.metric("dynamic_filtering_pass_rate"),
            "samples": [m["rollout/num_samples"] for m in metrics],
            "updates": [m["rlhf_ext/updates_attempted"] for m in metrics],
            "nodes": {i[:12]: sorted(a["class_name"] for a in actors if a["node_id"] == i) for i in nodes},
            "writer_node": starts[0]["node_id"][:12], "reward_requests": health["served"], "scores": scores,
            "max_weight_change": max(changed.values()) if changed else None}


# --- unit tests: the node check ----------------------------------------------------------------


def test_http_endpoints_take_each_http_entry_of_the_comma_list():
    assert nc.http_endpoints("http://127.0.0.1:5000/get_reward,/x/r.py,https://rm.example:8443/a") == [
        ("127.0.0.1", 5000), ("rm.example", 8443)]
    assert nc.http_endpoints("https://rm.example/get_reward") == [("rm.example", 443)]
    assert nc.http_endpoints("http://rm/get_reward") == [("rm", 80)]
    assert nc.http_endpoints(None) == [] and nc.http_endpoints("/x/reward.py") == []


def test_expectations_list_only_what_the_driver_sees_as_local_files(tmp_path):
    model, data, reward = tmp_path / "model", tmp_path / "train.jsonl", tmp_path / "reward.py"
    model.mkdir()
    data.write_text("{}\n")
    reward.write_text("def reward_func(q, p, l): ...\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text("{}")
    ns = SimpleNamespace(**{"actor.model_name_or_path": str(model), "data.prompt_dataset": f"{data},org/hub-set",
                            "eval.dataset": None, "reward.remote_url": f"{reward},http://10.0.0.1:5000/get_reward"})
    got = nc.expectations(ns, str(run_dir), environ={"RLHF_EXT_PLUGINS": "rlhf_ext"})
    assert got.paths == {"--actor.model_name_or_path": str(model), "--data.prompt_dataset": str(data),
                         "--reward.remote_url": str(reward),
                         "run record (--ckpt.path / --rlhf_ext.run_dir)": str(run_dir / "config.json")}
    assert got.endpoints == [("10.0.0.1", 5000)] and got.plugins == ["rlhf_ext"]
    hub = SimpleNamespace(**{"actor.model_name_or_path": "Qwen/Qwen2.5-0.5B", "reward.remote_url": None})
    assert nc.expectations(hub, None, environ={}).paths == {}  # a hub id: each node resolves it itself


def test_the_probe_reports_version_missing_files_and_unreachable_endpoints(tmp_path):
    from rlhf_ext import __version__

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(1)
    closed = _free_port()  # nothing listens there
    try:
        report = nc.make_probe()({"model": str(tmp_path), "data": str(tmp_path / "absent.jsonl")},
                                 [listening.getsockname(), ("127.0.0.1", closed)], 2.0)
    finally:
        listening.close()
    assert report["version"] == __version__ and report["python"] == sys.executable
    assert report["missing_paths"] == {"data": str(tmp_path / "absent.jsonl")}
    assert list(report["unreachable"]) == [f"127.0.0.1:{closed}"]
    assert "ConnectionRefusedError" in report["unreachable"][f"127.0.0.1:{closed}"]
    assert "import_error" not in report and report["node_id"] is None  # not in a Ray worker


def test_the_probe_runs_where_rlhf_ext_does_not_import(tmp_path):
    """Pickled by value, the probe reports the import error from an interpreter without rlhf_ext."""
    import cloudpickle

    python = python_without_rlhf_ext(tmp_path / "venv")
    blob = tmp_path / "probe.pkl"
    blob.write_bytes(cloudpickle.dumps(nc.make_probe()))
    code = ("import pickle, json, sys; f = pickle.load(open(sys.argv[1], 'rb')); "
            "print(json.dumps(f({'m': sys.argv[1]}, [], 1.0)))")
    out = subprocess.run([python, "-c", code, str(blob)], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["import_error"] == "ModuleNotFoundError: No module named 'rlhf_ext'"
    assert report["python"] == python and report["missing_paths"] == {}


def _good(node_id="aaaaaaaaaaaaaaaa", active=("rlhf_ext",), **over):
    from rlhf_ext import __version__

    report = {"hostname": "n1", "python": "/venv/bin/python", "version": __version__, "plugins_env": "rlhf_ext",
              "missing_paths": {}, "unreachable": {}, "location": "/venv/rlhf_ext"}
    report.update(over)
    return nc.NodeResult(node_id=node_id, address="10.0.0.1", report=report,
                         activation={**report, "active": list(active)})


def _expected():
    from rlhf_ext import __version__

    return nc.Expectations(version=__version__, plugins=["rlhf_ext"])


def test_verdict_is_none_when_every_node_can_run_the_plugin():
    assert nc.verdict([_good(), _good("bbbbbbbbbbbbbbbb")], _expected()) is None


def test_verdict_names_the_node_its_python_and_the_import_error():
    bad = nc.NodeResult(node_id="0123456789abcdef" * 3, address="10.0.0.2",
                        report={"hostname": "n2", "python": "/other/bin/python",
                                "import_error": "ModuleNotFoundError: No module named 'rlhf_ext'"})
    line = nc.verdict([_good(), bad], _expected())
    assert line.count("\n") == 0 and line.startswith("rlhf_ext: error: 1 of 2 Ray nodes cannot run the plugin: ")
    assert "node 0123456789ab (10.0.0.2, host n2): rlhf_ext is not importable there in its Python " \
           "/other/bin/python (ModuleNotFoundError: No module named 'rlhf_ext')" in line
    assert f"install rlhf_ext {_expected().version} in that environment" in line
    assert line.endswith("(RLHF_EXT_NODE_CHECK=0 skips this check)") and "aaaaaaaaaaaa" not in line


@pytest.mark.parametrize("over, words", [
    ({"active": ()}, "plugin(s) rlhf_ext not active in its Ray workers (RLHF_EXT_PLUGINS there is 'rlhf_ext'"),
    ({"version": "0.0.9"}, "it runs rlhf_ext 0.0.9 (/venv/rlhf_ext) but the driver runs"),
    ({"missing_paths": {"--actor.model_name_or_path": "/m"}},
     "it does not see --actor.model_name_or_path /m: put these on a filesystem every node mounts"),
    ({"unreachable": {"127.0.0.1:5000": "ConnectionRefusedError: refused"}},
     "it cannot connect to the reward server at 127.0.0.1:5000 (ConnectionRefusedError: refused): serve it on"),
    ({"import_error": "ImportError: boom"}, "rlhf_ext is not importable there in its Python /venv/bin/python"),
])  # fmt: skip
def test_verdict_names_each_cause(over, words):
    line = nc.verdict([_good("cccccccccccccccc", **over)], _expected())
    assert "1 of 1 Ray nodes" in line and "node cccccccccccc (10.0.0.1, host n1): " + words in line


def test_verdict_of_silent_and_dying_workers_and_of_several_bad_nodes():
    silent = nc.NodeResult(node_id="d" * 16, address="10.0.0.4", failure="no answer within 5 s")
    dying = _good("f" * 16)
    dying.activation, dying.activation_failure = None, "WorkerCrashedError: The worker died unexpectedly"
    line = nc.verdict([silent, _good("e" * 16, version="0.0.1"), _good(), dying], _expected())
    assert "3 of 4 Ray nodes" in line and line.count("\n") == 0
    assert "node dddddddddddd (10.0.0.4): its Ray workers did not answer the plugin check (no answer within 5 s)" in line
    assert "node eeeeeeeeeeee" in line
    assert "node ffffffffffff (10.0.0.1, host n1): a worker of this run started there with the plugin's setup hook " \
           "failed (WorkerCrashedError: The worker died unexpectedly); its log on that node says why" in line


def test_check_settings_from_the_environment():
    assert nc.enabled({}) and not nc.enabled({nc.ENV_CHECK: "0"})
    assert nc.timeout_s({}) == nc.DEFAULT_TIMEOUT_S and nc.timeout_s({nc.ENV_TIMEOUT: "7.5"}) == 7.5
    with pytest.raises(nc.NodeCheckError, match="RLHF_EXT_NODE_CHECK='maybe'"):
        nc.enabled({nc.ENV_CHECK: "maybe"})
    with pytest.raises(nc.NodeCheckError, match="RLHF_EXT_NODE_CHECK_TIMEOUT='-1'"):
        nc.timeout_s({nc.ENV_TIMEOUT: "-1"})


def test_cluster_record_lists_each_node_as_probed():
    dead = nc.NodeResult(node_id="f" * 16, address="10.0.0.9", failure="x")
    got = nc.cluster_record([_good(), dead], "127.0.0.1:6379")
    assert got["address"] == "127.0.0.1:6379"
    assert got["nodes"][0]["rlhf_ext"] and got["nodes"][0]["reward_endpoints_reachable"] is True
    assert got["nodes"][0]["active"] == ["rlhf_ext"] and got["nodes"][0]["node_id"] == "a" * 16
    assert got["nodes"][1]["rlhf_ext"] is None and got["nodes"][1]["reward_endpoints_reachable"] is None


def test_a_failed_start_check_ends_the_record_with_its_exit_code(tmp_path):
    """``fail_driver``: the ``end`` event says crashed with the check's exit code, not finished."""
    code = textwrap.dedent(f"""
        import sys
        from types import SimpleNamespace
        from rlhf_ext.patches.openrlhf import run_record as rr
        rr.start_driver_record(SimpleNamespace(**{{"ckpt.path": {str(tmp_path)!r}, "ckpt.load_enable": False}}))
        rr.update_driver_config(cluster={{"address": "127.0.0.1:1", "nodes": []}})
        rr.fail_driver(RuntimeError("node check"), 2)
        raise SystemExit(2)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    from rlhf_ext import runs

    record = tmp_path / "rlhf_ext_run"
    config = json.loads((record / runs.CONFIG).read_text())
    assert config["cluster"] == {"address": "127.0.0.1:1", "nodes": []}
    assert config["driver"]["pid"] > 0 and config["driver"]["host"] == socket.gethostname()
    end = [e for e in runs.read_jsonl(record / runs.EVENTS) if e["event"] == "end"]
    assert [(e["status"], e["exit_code"]) for e in end] == [("crashed", 2)]


def test_the_writer_names_its_host_and_process():
    from rlhf_ext.patches.openrlhf.run_record import writer_location

    where = writer_location()
    assert where["host"] == socket.gethostname() and where["pid"] == os.getpid()
    assert set(where) == {"host", "pid", "node_id", "node_ip"}


def test_the_train_log_parser_reads_actors_on_another_node():
    from rlhf_ext.tours.smoke import parse_train_log

    log = parse_train_log("(PolicyModelActor pid=41, ip=10.0.0.2) hello\n(PPOTrainer pid=40) hi\n")
    assert log.actor_pids == {"PolicyModelActor": [41], "PPOTrainer": [40]}


# --- the bad input, on a real two-node cluster -------------------------------------------------


def test_a_node_without_the_plugin_stops_the_run_with_one_line(tmp_path):
    """Node 2 runs a Python environment without rlhf_ext: the driver says so in one line, exits 2
    before any model loads, and nothing of the run is left (the cluster itself is the user's)."""
    from rlhf_ext import runs
    from rlhf_ext.tours.smoke import run_record_dir, run_training

    # the check stops the run before the model or the data are read: files of the right names do
    task = tmp_path / "task"
    (task / "model").mkdir(parents=True)
    (task / "train.jsonl").write_text('{"prompt": "1+1", "label": "2"}\n')
    python = python_without_rlhf_ext(tmp_path / "venv-without-plugin")
    with two_node_cluster(tmp_path, worker_python=python) as cluster:
        placement = cluster.placement()
        worker_node = next(n["node_id"] for n in placement["nodes"] if WORKER_RESOURCE in n["resources"])
        cmd = two_node_command(tmp_path, task, "rlhf_ext:math")
        started = time.monotonic()
        rc = run_training(cmd, tmp_path / "train.log", timeout=600, echo=False, cwd=tmp_path,
                          env={"RAY_ADDRESS": cluster.address})
        wall = time.monotonic() - started
        text = (tmp_path / "train.log").read_text()
        after = cluster.placement()
    assert rc == nc.EXIT_CODE, text[-4000:]
    errors = [ln for ln in text.splitlines() if ln.startswith("rlhf_ext: error:")]
    assert len(errors) == 1, errors
    line = errors[0]
    assert f"node {worker_node[:12]} (" in line and "1 of 2 Ray nodes cannot run the plugin" in line
    assert f"rlhf_ext is not importable there in its Python {python} (ModuleNotFoundError: No module named " \
           "'rlhf_ext')" in line
    head = next(n["node_id"] for n in placement["nodes"] if HEAD_RESOURCE in n["resources"])
    assert head[:12] not in line
    # stopped before OpenRLHF created an actor; the run record says crashed with the check's code
    assert not [a for a in after["actors"] if a["class_name"] in OPENRLHF_ACTORS], after["actors"]
    assert "Traceback" not in text  # round one asks node 2 without the setup hook: no worker died there
    events = runs.read_jsonl(run_record_dir(tmp_path / "trained") / runs.EVENTS)
    assert [(e["status"], e["exit_code"]) for e in events if e["event"] == "end"] == [("crashed", 2)]
    assert cluster.processes() == []  # the cluster's own processes are gone after the context
    assert wall < 300, wall
