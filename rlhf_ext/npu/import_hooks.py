"""Run a callback right after a named module is imported (or now, if it already was).

The device shims must reach every process where the plugin is on, yet they run at interpreter
start-up, long before (and often without) OpenRLHF, Ray or even torch being imported there.
Deferring each patch to the moment its target module finishes executing keeps start-up cheap and
still patches a module before any other code can use it: the callback runs inside the import
statement that loaded the module, so e.g. ``from openrlhf.models.utils import compute_entropy`` in a
later module already sees the patched name.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from typing import Callable, Dict, List

Callback = Callable[[object], None]

_lock = threading.RLock()
_pending: Dict[str, List[Callback]] = {}


class _RunCallbacksLoader(importlib.abc.Loader):
    """Delegates to the real loader, then runs the callbacks registered for the module."""

    def __init__(self, wrapped, fullname: str):
        self._wrapped = wrapped
        self._fullname = fullname

    def create_module(self, spec):
        return self._wrapped.create_module(spec)

    def exec_module(self, module):
        self._wrapped.exec_module(module)
        # Hand the module its real loader back: tools such as inspect and importlib.resources look at it.
        module.__loader__ = self._wrapped
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._wrapped
        _run_pending(self._fullname, module)

    def __getattr__(self, name):
        return getattr(self._wrapped, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the finders after it and wraps the loader of watched modules."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _pending:
            return None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _RunCallbacksLoader(spec.loader, fullname)
        return spec

    def __repr__(self) -> str:
        return "<rlhf_ext post-import hooks>"


_finder = _PostImportFinder()


def _run_pending(fullname: str, module) -> None:
    with _lock:
        callbacks = _pending.pop(fullname, [])
    for callback in callbacks:
        callback(module)


def when_imported(module_name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once ``module_name`` is imported; immediately if it already is."""
    with _lock:
        module = sys.modules.get(module_name)
        if module is None:
            _pending.setdefault(module_name, []).append(callback)
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
            return
    callback(module)


def pending_modules() -> List[str]:
    """Modules whose callbacks have not run yet (tests and diagnostics)."""
    with _lock:
        return sorted(_pending)


__all__ = ["pending_modules", "when_imported"]
