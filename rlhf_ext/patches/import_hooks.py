"""Run a callback right after a module is imported ("post-import hooks"), wherever the import happens.

The OpenRLHF patches must land in every process that uses OpenRLHF -- the driver, each Ray actor,
vLLM's workers -- yet importing OpenRLHF eagerly would drag DeepSpeed into processes that
deliberately avoid it (OpenRLHF keeps deepspeed out of its vLLM workers). So each patch waits
for its own target module: a finder at the front of ``sys.meta_path`` wraps the loader of the
watched names and calls the hooks once the module body has run.
"""

from __future__ import annotations

import sys
import threading

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms at start-up
if TYPE_CHECKING:
    from typing import Callable, Dict, List

    Hook = Callable[[object], None]

_lock = threading.RLock()
_hooks: Dict[str, List[Hook]] = {}


class _HookedLoader:
    """Delegates to the real loader, then runs the hooks registered for the module."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        self._loader.exec_module(module)
        # Point the module back at its real loader: inspect, pickle and reload keep working.
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        _run_hooks(module.__name__, module)

    def __getattr__(self, name):  # get_source, get_filename, is_package, ...
        return getattr(self._loader, name)


class _PostImportFinder:
    """Finds watched modules through the other finders and wraps their loaders."""

    _local = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        with _lock:
            if fullname not in _hooks:
                return None
        if getattr(self._local, "busy", False):
            return None
        self._local.busy = True
        try:
            for finder in sys.meta_path:
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
        spec.loader = _HookedLoader(spec.loader)
        return spec

    def __repr__(self) -> str:
        return "<rlhf_ext post-import hook finder>"


_finder = _PostImportFinder()


def _run_hooks(name: str, module) -> None:
    with _lock:
        hooks = _hooks.pop(name, [])
    for hook in hooks:
        hook(module)


def when_imported(name: str, hook: Hook) -> None:
    """Call ``hook(module)`` once ``name`` is imported; immediately if it already is.

    Each registration fires once. An exception in a hook propagates out of the ``import``
    statement that triggered it, which is what a failed patch should do.
    """
    with _lock:
        module = sys.modules.get(name)
        if module is None or _is_initializing(module):
            _hooks.setdefault(name, []).append(hook)
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
            return
    hook(module)


def pending() -> Dict[str, int]:
    """Watched module names that have not been imported yet, with their number of hooks."""
    with _lock:
        return {name: len(hooks) for name, hooks in _hooks.items()}


def clear(name: str = None) -> None:
    """Forget pending hooks (all, or those for ``name``); removes the finder when none are left."""
    with _lock:
        if name is None:
            _hooks.clear()
        else:
            _hooks.pop(name, None)
        if not _hooks:
            while _finder in sys.meta_path:
                sys.meta_path.remove(_finder)


def _is_initializing(module) -> bool:
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))
