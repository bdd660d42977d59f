"""Before any model loads on a Ray cluster the driver joined: can every node run the plugin?

On a cluster ``ray.init`` starts itself there is one node and every worker inherits the driver's
environment. A driver that joins an existing cluster (``RAY_ADDRESS``, ``ray.init(address=...)``,
``ray job submit``) sends the plugin to the workers through the job's runtime env
(:mod:`rlhf_ext.patches.activation.ray_env`), and each node's raylet starts those workers with
*that node's* Python. A node whose environment lacks rlhf_ext then kills every worker it starts at
Ray's ``worker_process_setup_hook`` (``ModuleNotFoundError``; Ray reports only "The worker died
unexpectedly"), and the run dies, or waits, the first time OpenRLHF places an actor there, after
the other nodes have loaded their models.

So, right after ``ray.init`` and only when the driver joined an existing cluster or the cluster has
more than one node, the driver runs one tiny Ray task pinned to each alive node
(``NodeAffinitySchedulingStrategy(soft=False)``, ``num_cpus=0``, no retries), in the job's runtime env
but with the plugin's setup hook switched off for that one task, so that a node without rlhf_ext
answers instead of killing the worker. The task reports the node's interpreter and rlhf_ext version
(or the import error), whether the files the run names (model, data, the reward file, the driver's
``config.json`` in the run directory) exist there, and whether it can open a TCP connection to each
HTTP reward endpoint. When every node passes, a second task per node runs in the job's own runtime
env, the path every actor of the run takes, and reports the plugins active there. Any failure stops
the driver with one line naming the node and the cause, before a model is loaded;
``RLHF_EXT_NODE_CHECK=0`` skips the check and ``RLHF_EXT_NODE_CHECK_TIMEOUT`` (seconds, default 120) bounds each round.

Ray sources read (2.55): ``_private/workers/default_worker.py`` (a failing setup hook ends the
worker with ``drain_and_exit_worker("system", ...)``), ``_private/runtime_env/setup_hook.py`` (the
hook travels as the env var ``__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR``), ``_private/worker.py``
(``ray.init`` puts the driver's working directory on every worker's ``sys.path`` when joining a
cluster: a checkout of rlhf_ext there is importable on every node that mounts it).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

ENV_CHECK = "RLHF_EXT_NODE_CHECK"
ENV_TIMEOUT = "RLHF_EXT_NODE_CHECK_TIMEOUT"
DEFAULT_TIMEOUT_S = 120.0
EXIT_CODE = 2
# Ray's env var for the job's worker_process_setup_hook (ray._private.ray_constants); an empty value
# in one task's runtime env switches the hook off for that task's worker (default_worker.py: `if key:`).
SETUP_HOOK_ENV_VAR = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"

# flag -> dotted dest of the files every node must see when the driver sees them
PATH_SETTINGS = (
    ("--actor.model_name_or_path", "actor.model_name_or_path"),
    ("--data.prompt_dataset", "data.prompt_dataset"),
    ("--eval.dataset", "eval.dataset"),
    ("--train.agent_func_path", "train.agent_func_path"),
)


class NodeCheckError(RuntimeError):
    """A node of the cluster cannot run the plugin (the message is the one line the driver prints)."""


def enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    environ = os.environ if environ is None else environ
    value = environ.get(ENV_CHECK, "1").strip().lower()
    if value in ("0", "false", "no", "off"):
        return False
    if value in ("", "1", "true", "yes", "on"):
        return True
    raise NodeCheckError(f"{ENV_CHECK}={environ[ENV_CHECK]!r}: expected 1 or 0")


def timeout_s(environ: Optional[Mapping[str, str]] = None) -> float:
    environ = os.environ if environ is None else environ
    raw = environ.get(ENV_TIMEOUT, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise NodeCheckError(f"{ENV_TIMEOUT}={raw!r}: expected a number of seconds > 0")
    return value


# --- what the driver asks each node ------------------------------------------------------------


@dataclass
class Expectations:
    """What every node must offer: built from the parsed flags in the driver."""

    version: str
    plugins: List[str]
    paths: Dict[str, str] = field(default_factory=dict)  # label -> absolute path the driver sees
    endpoints: List[Tuple[str, int]] = field(default_factory=list)  # HTTP reward endpoints


def http_endpoints(remote_url: Optional[str]) -> List[Tuple[str, int]]:
    """``(host, port)`` of each ``http(s)://`` entry of ``--reward.remote_url`` (OpenRLHF splits it on commas)."""
    from urllib.parse import urlsplit

    out = []
    for part in str(remote_url or "").split(","):
        part = part.strip()
        if not part.lower().startswith(("http://", "https://")):
            continue
        url = urlsplit(part)
        if url.hostname:
            out.append((url.hostname, url.port or (443 if url.scheme.lower() == "https" else 80)))
    return out


def expectations(namespace, run_dir: Optional[str], *, environ: Optional[Mapping[str, str]] = None,
                 exists=os.path.exists) -> Expectations:
    """From the parsed flags: the files the driver sees (model, data, a ``.py`` reward file, the run
    record's ``config.json``) and the HTTP reward endpoints. A value that is no local path here (a hub
    model id, a dataset name) is not checked: the nodes resolve it themselves."""
    from rlhf_ext import __version__, runs

    environ = os.environ if environ is None else environ
    paths: Dict[str, str] = {}
    for flag, dest in PATH_SETTINGS:
        value = getattr(namespace, dest, None)
        if not isinstance(value, str):
            continue
        for i, part in enumerate(p.strip() for p in value.split(",")):
            if part and exists(part):
                paths[flag if i == 0 else f"{flag} ({i + 1})"] = os.path.abspath(part)
    remote_url = getattr(namespace, "reward.remote_url", None)
    for part in str(remote_url or "").split(","):
        part = part.strip()
        if part.endswith(".py") and exists(part):
            paths["--reward.remote_url"] = os.path.abspath(part)
    if run_dir:
        config = os.path.join(run_dir, runs.CONFIG)
        if exists(config):
            paths["run record (--ckpt.path / --rlhf_ext.run_dir)"] = config
    plugins = [p.strip() for p in str(environ.get("RLHF_EXT_PLUGINS", "")).split(",") if p.strip()]
    return Expectations(version=__version__, plugins=plugins, paths=paths, endpoints=http_endpoints(remote_url))


def make_probe():
    """The task run on each node. Built in a function so that Ray pickles it by value: it must run
    (and say what is wrong) on a node where ``rlhf_ext`` itself cannot be imported."""

    def probe(paths: Dict[str, str], endpoints: List[Tuple[str, int]], connect_timeout: float) -> Dict[str, Any]:
        import os
        import socket
        import sys

        report: Dict[str, Any] = {"hostname": socket.gethostname(), "pid": os.getpid(), "python": sys.executable}
        report["node_id"] = None
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():  # get_runtime_context() would start a cluster
            report["node_id"] = ray.get_runtime_context().get_node_id()
        try:
            import rlhf_ext

            report["version"] = getattr(rlhf_ext, "__version__", None)
            report["location"] = os.path.dirname(getattr(rlhf_ext, "__file__", "") or "")
            # looked up, not imported: the setup hook loads the registry when it activates anything
            registry = sys.modules.get("rlhf_ext.patches.activation.plugin")
            report["active"] = sorted(registry.active_plugins()) if registry is not None else []
        except Exception as exc:  # noqa: BLE001 - the point is to report it
            report["import_error"] = f"{type(exc).__name__}: {exc}"
        report["plugins_env"] = os.environ.get("RLHF_EXT_PLUGINS", "")
        report["missing_paths"] = {label: path for label, path in paths.items() if not os.path.exists(path)}
        unreachable = {}
        for host, port in endpoints:
            try:
                socket.create_connection((host, port), timeout=connect_timeout).close()
            except OSError as exc:
                unreachable[f"{host}:{port}"] = f"{type(exc).__name__}: {exc}"
        report["unreachable"] = unreachable
        return report

    return probe


# --- the verdict (pure) --------------------------------------------------------------------------


@dataclass
class NodeResult:
    """One node: its identity from ``ray.nodes()``, what its probe said without the plugin's setup
    hook (``report``; ``failure`` when it never answered), and what a worker of the job said with it
    (``activation``; ``activation_failure`` when that worker died)."""

    node_id: str
    address: str
    head: bool = False
    report: Optional[Dict[str, Any]] = None
    failure: Optional[str] = None
    activation: Optional[Dict[str, Any]] = None
    activation_failure: Optional[str] = None

    def name(self) -> str:
        where = self.address + (", head" if self.head else "")
        host = (self.report or {}).get("hostname")
        if host:
            where += f", host {host}"
        return f"node {self.node_id[:12]} ({where})"


def node_problem(node: NodeResult, expected: Expectations) -> Optional[str]:
    """Why ``node`` cannot run the plugin, in words (``None``: it can)."""
    report = node.report
    if report is None:
        return f"its Ray workers did not answer the plugin check ({node.failure})"
    python = report.get("python") or "?"
    if report.get("import_error"):
        return (f"rlhf_ext is not importable there in its Python {python} ({report['import_error']}), so Ray's "
                f"worker setup hook would kill every worker of this run on that node; install rlhf_ext "
                f"{expected.version} in that environment and restart the node's `ray start`")
    if report.get("version") != expected.version:
        return (f"it runs rlhf_ext {report.get('version')} ({report.get('location')}) but the driver runs "
                f"{expected.version}: install the same release on every node")
    missing = report.get("missing_paths") or {}
    if missing:
        listed = ", ".join(f"{label} {path}" for label, path in missing.items())
        return f"it does not see {listed}: put these on a filesystem every node mounts at the same path"
    unreachable = report.get("unreachable") or {}
    if unreachable:
        listed = ", ".join(f"{where} ({why})" for where, why in unreachable.items())
        return (f"it cannot connect to the reward server at {listed}: serve it on an address every node reaches "
                f"(rlhf-ext reward-server --host 0.0.0.0)")
    if node.activation is None:
        if node.activation_failure is None:
            return None  # not asked (another node failed first)
        return (f"a worker of this run started there with the plugin's setup hook failed ({node.activation_failure}); "
                "its log on that node says why")
    inactive = [p for p in expected.plugins if p not in (node.activation.get("active") or [])]
    if inactive:
        return (f"plugin(s) {','.join(inactive)} not active in its Ray workers (RLHF_EXT_PLUGINS there is "
                f"{node.activation.get('plugins_env')!r}; a runtime env of the job that sets RLHF_EXT_PLUGINS wins "
                "over the driver's)")
    return None


def verdict(nodes: Sequence[NodeResult], expected: Expectations) -> Optional[str]:
    """The one line the driver prints when some node cannot run the plugin (``None``: all can)."""
    problems = [(node, node_problem(node, expected)) for node in nodes]
    bad = [(node, why) for node, why in problems if why]
    if not bad:
        return None
    parts = "; ".join(f"{node.name()}: {why}" for node, why in bad)
    return f"rlhf_ext: error: {len(bad)} of {len(nodes)} Ray nodes cannot run the plugin: {parts} ({ENV_CHECK}=0 skips this check)"


def cluster_record(nodes: Sequence[NodeResult], address: Optional[str]) -> Dict[str, Any]:
    """The ``cluster`` block of ``config.json``: each node the driver checked, as its probes saw it."""
    out = []
    for node in nodes:
        report = node.report or {}
        out.append({"node_id": node.node_id, "address": node.address, "head": node.head,
                    "hostname": report.get("hostname"), "python": report.get("python"),
                    "rlhf_ext": report.get("version"), "active": (node.activation or {}).get("active"),
                    "reward_endpoints_reachable": not report.get("unreachable") if node.report else None})  # fmt: skip
    return {"address": address, "nodes": out}


# --- running it on the cluster (driver) ----------------------------------------------------------


def joined_existing_cluster(ray_module) -> bool:
    """Whether this driver connected to a cluster it did not start (``ray start``, a job submission)."""
    node = getattr(getattr(ray_module, "_private", None), "worker", None)
    node = getattr(node, "_global_node", None)
    head = getattr(node, "head", None)
    return head is False


def _alive_nodes(ray_module) -> List[NodeResult]:
    nodes = []
    for info in ray_module.nodes():
        if not info.get("Alive"):
            continue
        resources = info.get("Resources") or {}
        nodes.append(NodeResult(node_id=str(info["NodeID"]), address=str(info.get("NodeManagerAddress", "?")),
                                head=any(k == "node:__internal_head__" for k in resources)))
    return nodes


def _run_probes(ray_module, nodes: Sequence[NodeResult], expected: Expectations, timeout: float,
                *, without_setup_hook: bool) -> Dict[str, Tuple[Optional[Dict[str, Any]], Optional[str]]]:
    """node id -> (report, failure) of one round of probe tasks, one pinned to each node."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    options: Dict[str, Any] = {"num_cpus": 0, "max_retries": 0}
    if without_setup_hook:
        options["runtime_env"] = {"env_vars": {SETUP_HOOK_ENV_VAR: ""}}
    task = ray_module.remote(make_probe())
    refs = {}
    for node in nodes:
        strategy = NodeAffinitySchedulingStrategy(node_id=node.node_id, soft=False)
        refs[node.node_id] = task.options(scheduling_strategy=strategy, **options).remote(
            expected.paths, expected.endpoints, min(10.0, timeout / 2))
    ready, _ = ray_module.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
    ready = set(ready)
    out: Dict[str, Tuple[Optional[Dict[str, Any]], Optional[str]]] = {}
    for node_id, ref in refs.items():
        if ref not in ready:
            ray_module.cancel(ref, force=True)
            out[node_id] = (None, f"no answer within {timeout:g} s ({ENV_TIMEOUT})")
            continue
        try:
            out[node_id] = (ray_module.get(ref), None)
        except Exception as exc:  # noqa: BLE001 - a dead worker is the finding
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            out[node_id] = (None, f"{type(exc).__name__}: {first}")
    return out


def check_cluster(ray_module, expected: Expectations, *, timeout: Optional[float] = None,
                  nodes: Optional[List[NodeResult]] = None) -> List[NodeResult]:
    """Probe every alive node; raise :class:`NodeCheckError` with the one-line verdict if one fails.

    Round one runs without the plugin's setup hook, so a node without rlhf_ext answers (what is
    missing, with its interpreter) instead of killing the worker; round two, on the nodes that passed,
    runs in the job's own runtime env, the way OpenRLHF's actors start, and reports the active plugins.
    """
    timeout = timeout_s() if timeout is None else timeout
    nodes = _alive_nodes(ray_module) if nodes is None else nodes
    by_id = {node.node_id: node for node in nodes}
    for node_id, (report, failure) in _run_probes(ray_module, nodes, expected, timeout,
                                                  without_setup_hook=True).items():
        by_id[node_id].report, by_id[node_id].failure = report, failure
    if verdict(nodes, expected) is None:
        for node_id, (report, failure) in _run_probes(ray_module, nodes, Expectations(expected.version, []),
                                                      timeout, without_setup_hook=False).items():
            by_id[node_id].activation, by_id[node_id].activation_failure = report, failure
    line = verdict(nodes, expected)
    if line:
        raise NodeCheckError(line)
    return nodes


_prepared: Dict[str, Any] = {}


def prepare(namespace, run_dir: Optional[str]) -> None:
    """Driver, after parsing: remember what the nodes will be asked about."""
    _prepared["namespace"] = namespace
    _prepared["run_dir"] = run_dir


def after_ray_init(kwargs: dict, ray_module=None) -> None:
    """The patched ``ray.init`` (driver) calls this once Ray is up: check the nodes, record them in
    ``config.json``, or stop the run with one line."""
    namespace = _prepared.pop("namespace", None)
    run_dir = _prepared.pop("run_dir", None)
    if namespace is None:
        return  # not an OpenRLHF PPO driver parsed by the plugin
    if ray_module is None:
        import ray as ray_module
    try:
        if not enabled():
            return
        nodes = _alive_nodes(ray_module)
        if not joined_existing_cluster(ray_module) and len(nodes) < 2:
            return  # a local cluster ray.init started: its workers inherit this process's environment
        nodes = check_cluster(ray_module, expectations(namespace, run_dir), nodes=nodes)
    except NodeCheckError as exc:
        from .run_record import fail_driver

        sys.stderr.write(f"{exc}\n")
        sys.stderr.flush()
        fail_driver(exc, EXIT_CODE)
        try:
            ray_module.shutdown()
        finally:
            raise SystemExit(EXIT_CODE)
    from .run_record import update_driver_config

    address = kwargs.get("address") or os.environ.get("RAY_ADDRESS")
    update_driver_config(cluster=cluster_record(nodes, address))
    sys.stderr.write(f"rlhf_ext: the plugin is ready on all {len(nodes)} Ray nodes "
                     f"({', '.join(n.node_id[:12] for n in nodes)})\n")


__all__ = ["EXIT_CODE", "Expectations", "NodeCheckError", "NodeResult", "after_ray_init", "check_cluster",
           "cluster_record", "enabled", "expectations", "http_endpoints", "make_probe", "node_problem", "prepare",
           "timeout_s", "verdict"]
