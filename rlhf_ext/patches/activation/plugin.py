"""Plugin registry and per-process activation.

A plugin is a name bound to an ``activate(role)`` function. ``--plugin NAME`` on an OpenRLHF
command line (see :mod:`rlhf_ext.patches.activation.startup`), ``RLHF_EXT_PLUGINS=a,b`` in the environment,
Ray's ``worker_process_setup_hook`` and vLLM's ``vllm.general_plugins`` entry point all end in
:func:`activate`. Activation exports ``RLHF_EXT_PLUGINS`` so every child process -- Ray's raylet
and workers on a local cluster, vLLM's engine and worker processes -- activates the same plugins
at its own start-up, and logs one line per process with its pid and role.

Third-party plugins register with :func:`register_plugin` or the entry point group
``rlhf_ext.plugins`` (value: ``module:function`` taking ``role``).
"""

from __future__ import annotations

import os
import sys
import threading

from .command_line import host_cli

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms at start-up
if TYPE_CHECKING:
    from typing import Callable, Dict, Iterable, List, Optional

ENV_VAR = "RLHF_EXT_PLUGINS"
QUIET_ENV_VAR = "RLHF_EXT_QUIET"
ENTRY_POINT_GROUP = "rlhf_ext.plugins"

# name -> "module:function" (imported on activation) or a callable.
_registry: Dict[str, object] = {"rlhf_ext": "rlhf_ext.patches.activation.plugin:activate_rlhf_ext"}
_active: Dict[str, str] = {}  # name -> role it was activated with
_lock = threading.RLock()


class UnknownPluginError(ValueError):
    """``--plugin NAME`` / ``RLHF_EXT_PLUGINS`` named a plugin nobody registered."""


def register_plugin(name: str, activate_fn: Callable[[str], None], *, override: bool = False) -> None:
    """Make ``--plugin NAME`` call ``activate_fn(role)`` in every process of the run."""
    if not isinstance(name, str) or not name or "," in name or name != name.strip():
        raise ValueError(f"plugin name must be a non-empty string without commas or spaces, got {name!r}")
    if not callable(activate_fn) and not (isinstance(activate_fn, str) and ":" in activate_fn):
        raise TypeError(f"plugin {name!r}: activate_fn must be callable or 'module:function', got {activate_fn!r}")
    with _lock:
        if name in _registry and not override and _registry[name] is not activate_fn:
            raise ValueError(f"plugin {name!r} is already registered; pass override=True to replace it")
        _registry[name] = activate_fn


def _entry_point_plugins() -> Dict[str, object]:
    from importlib import metadata

    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def available_plugins() -> List[str]:
    """Registered plugin names, including those declared through entry points."""
    with _lock:
        names = set(_registry)
    names.update(_entry_point_plugins())
    return sorted(names)


def _resolve(name: str) -> Callable[[str], None]:
    with _lock:
        target = _registry.get(name)
    if target is None:
        ep = _entry_point_plugins().get(name)
        if ep is None:
            raise UnknownPluginError(
                f"unknown plugin {name!r}; available plugins: {', '.join(available_plugins())} "
                f"(a package adds one through the {ENTRY_POINT_GROUP!r} entry point group)"
            )
        return ep.load()
    if isinstance(target, str):
        import importlib

        module_name, _, attr = target.partition(":")
        return getattr(importlib.import_module(module_name), attr)
    return target


def parse_names(values: Iterable[str]) -> List[str]:
    """``["a,b", "c", "a"]`` -> ``["a", "b", "c"]``: comma lists, order kept, duplicates and blanks dropped."""
    names: List[str] = []
    for value in values:
        for name in str(value).split(","):
            name = name.strip()
            if name and name not in names:
                names.append(name)
    return names


def requested_from_env() -> List[str]:
    return parse_names([os.environ.get(ENV_VAR, "")])


def check_names(names: Iterable[str]) -> None:
    """Raise :class:`UnknownPluginError` for the first unknown name, before anything is activated."""
    for name in names:
        with _lock:
            known = name in _registry
        if not known and name not in _entry_point_plugins():
            _resolve(name)  # raises with the list of available plugins


def detect_role() -> str:
    """What this process is, for the activation log line and the driver-only patches."""
    orig = list(getattr(sys, "orig_argv", []) or [])
    if host_cli() is not None:
        return "driver"
    argv0 = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if argv0 == "default_worker.py" or any(a.endswith("/ray/_private/workers/default_worker.py") for a in orig):
        return "ray-worker"
    if any("from multiprocessing" in a for a in orig):  # spawn / forkserver children, resource tracker
        return "mp-child"
    return "process"


def _log(line: str) -> None:
    if os.environ.get(QUIET_ENV_VAR, "") not in ("", "0"):
        return
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except Exception:  # a closed stderr must not break the process
        pass


def activate(names: Optional[Iterable[str]] = None, *, role: Optional[str] = None) -> List[str]:
    """Activate plugins in this process (default: those in ``RLHF_EXT_PLUGINS``); idempotent, thread-safe.

    Unknown names raise :class:`UnknownPluginError` before any plugin is activated. Returns the
    names newly activated by this call.
    """
    names = requested_from_env() if names is None else parse_names(names)
    if not names:
        return []
    check_names(names)
    role = role or detect_role()
    newly: List[str] = []
    with _lock:
        for name in names:
            if name in _active:
                continue
            _resolve(name)(role)
            _active[name] = role
            newly.append(name)
        exported = parse_names([os.environ.get(ENV_VAR, "")] + list(_active))
        os.environ[ENV_VAR] = ",".join(exported)
    if newly:
        _log(f"rlhf_ext: activated plugin(s) {','.join(newly)} (pid={os.getpid()}, ppid={os.getppid()}, role={role})")
    return newly


def _importable(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def activate_rlhf_ext(role: str) -> None:
    """The ``rlhf_ext`` plugin: the glue of each framework this process can run.

    A driver activates the framework whose command line it runs (OpenRLHF or MindSpeed-RL). Other
    processes (Ray workers, vLLM workers, ...) activate the OpenRLHF glue and, where
    ``mindspeed_rl`` is importable, the MindSpeed-RL glue; each only waits for its own modules to
    be imported, so the unused one costs nothing.
    """
    host = host_cli() if role == "driver" else None
    if host != "mindspeed_rl" and (host == "openrlhf" or _importable("openrlhf") or not _importable("mindspeed_rl")):
        from .. import openrlhf

        openrlhf.activate(role)
    if host != "openrlhf" and _importable("mindspeed_rl"):
        from .. import mindspeed_rl

        mindspeed_rl.activate(role)


def active_plugins() -> Dict[str, str]:
    """``{name: role}`` of the plugins active in this process."""
    with _lock:
        return dict(_active)


def is_active(name: str = "rlhf_ext") -> bool:
    with _lock:
        return name in _active


def ray_worker_setup() -> None:
    """Ray ``worker_process_setup_hook``: activate what the job's ``RLHF_EXT_PLUGINS`` asks for."""
    activate(role="ray-worker")


def _forget_for_tests(names: Optional[Iterable[str]] = None) -> None:
    """Mark plugins inactive again (tests pair this with undoing their patches)."""
    with _lock:
        for name in list(_active) if names is None else list(names):
            _active.pop(name, None)
