"""Run a callback right after a named module is imported (or now, if it already was): post-import hooks.

Patches must reach every process where the plugin is on -- the driver, each Ray actor, vLLM's
workers -- yet they are installed at interpreter start-up, long before (and often without)
OpenRLHF, Ray or even torch being imported there, and importing those eagerly would drag
DeepSpeed into processes that deliberately avoid it (OpenRLHF keeps deepspeed out of its vLLM
workers). So each patch waits for its own target module: a finder at the front of
``sys.meta_path`` wraps the loader of the watched names and runs the callbacks once the module
body has run, inside the import statement that loaded it -- e.g. ``from openrlhf.models.utils import
compute_entropy`` in a later module already sees the patched name.

The device shims (:mod:`rlhf_ext.npu`) and the framework glue (:mod:`rlhf_ext.patches`) both use
this one module; it lives on the ground floor (:mod:`rlhf_ext.seams`), below both.
"""

from __future__ import annotations

import sys
import threading

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms at start-up
if TYPE_CHECKING:
    from typing import Callable, Dict, List

    Callback = Callable[[object], None]

_lock = threading.RLock()
_pending: Dict[str, List[Callback]] = {}


class _RunCallbacksLoader:
    """Delegates to the real loader, then runs the callbacks registered for the module."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        self._loader.exec_module(module)
        # Hand the module its real loader back: inspect, pickle, reload and importlib.resources look at it.
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        _run_pending(module.__name__, module)

    def __getattr__(self, name):  # get_source, get_filename, is_package, ...
        return getattr(self._loader, name)


class _PostImportFinder:
    """Finds nothing itself: asks the finders after it and wraps the loader of watched modules."""

    _local = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        with _lock:
            if fullname not in _pending:
                return None
        # A finder after us may itself import (and so ask us again): answer nothing while busy.
        if getattr(self._local, "busy", False):
            return None
        self._local.busy = True
        try:
            for finder in list(sys.meta_path):
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._local.busy = False
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _RunCallbacksLoader(spec.loader)
        return spec

    def __repr__(self) -> str:
        return "<rlhf_ext post-import hooks>"


_finder = _PostImportFinder()


def _run_pending(name: str, module) -> None:
    with _lock:
        callbacks = _pending.pop(name, [])
    for callback in callbacks:
        callback(module)


def _runs_callbacks_when_loaded(module) -> bool:
    """Whether ``module`` is still executing under our loader, which runs the pending callbacks at its end."""
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False)) and isinstance(getattr(spec, "loader", None), _RunCallbacksLoader)


def when_imported(module_name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once ``module_name`` is imported; immediately if it already is.

    Each registration fires once. A module still executing under these hooks' loader gets the
    callback when its body has finished. An exception in a callback propagates out of the
    ``import`` statement that triggered it, which is what a failed patch should do.
    """
    with _lock:
        module = sys.modules.get(module_name)
        if module is None or _runs_callbacks_when_loaded(module):
            _pending.setdefault(module_name, []).append(callback)
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
            return
    callback(module)


def pending_modules() -> List[str]:
    """Watched modules whose callbacks have not run yet (tests and diagnostics)."""
    with _lock:
        return sorted(_pending)


def clear(module_name: str = None) -> None:
    """Forget pending callbacks (all, or those for ``module_name``); removes the finder when none are left."""
    with _lock:
        if module_name is None:
            _pending.clear()
        else:
            _pending.pop(module_name, None)
        if not _pending:
            while _finder in sys.meta_path:
                sys.meta_path.remove(_finder)


__all__ = ["clear", "pending_modules", "when_imported"]
