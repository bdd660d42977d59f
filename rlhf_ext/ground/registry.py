"""Name registries with third-party entry points, shared by the algorithms and the rewards.

Modelled on verl's ``core_algos.py``: a decorator registers a function under a name, a getter
looks it up, an unknown name lists the known ones. A third-party package adds entries by declaring
an entry point whose value is a module; every module of the group is imported on the first lookup
and its decorators do the rest. Torch-free on purpose: the reward grader's worker processes use it.
"""

from __future__ import annotations

import threading
import warnings
from importlib import metadata
from typing import Any, Callable, Dict, List, Optional, Type


class UnknownNameError(KeyError, ValueError):
    """An unknown registered name; a ``KeyError`` for lookups and a ``ValueError`` for argument parsers."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class EntryPointGroup:
    """Imports every module declared in one entry point group, once per process, thread-safely."""

    def __init__(self, group: str):
        self.group = group
        self._lock = threading.RLock()
        self._loaded = False
        self.failures: Dict[str, str] = {}

    def load(self) -> Dict[str, str]:
        """Import the group's modules (first call only); return the failures, ``{name: error}``.

        A broken third-party plugin is reported with a warning rather than breaking every lookup;
        a later lookup of a missing name says which entry points failed.
        """
        with self._lock:
            if self._loaded:
                return dict(self.failures)
            # Set first: the modules we import call back into the registries.
            self._loaded = True
            for ep in metadata.entry_points(group=self.group):
                try:
                    ep.load()
                except Exception as exc:  # a third party's bug must not take ours down
                    self.failures[ep.name] = f"{type(exc).__name__}: {exc}"
                    warnings.warn(
                        f"rlhf_ext: entry point {ep.name!r} ({ep.value}) in group {self.group!r} "
                        f"failed to load: {type(exc).__name__}: {exc}",
                        RuntimeWarning,
                        stacklevel=3,
                    )
            return dict(self.failures)

    def failure_hint(self) -> str:
        if not self.failures:
            return ""
        failed = ", ".join(f"{k} ({v})" for k, v in sorted(self.failures.items()))
        return f"; these {self.group} entry points failed to load: {failed}"

    def reset(self) -> None:
        """Forget what was loaded (tests install a plugin package mid-session)."""
        with self._lock:
            self._loaded = False
            self.failures.clear()


class Registry:
    """A thread-safe mapping from names to entries of one kind (e.g. "advantage estimator").

    ``identity`` maps an entry to what makes two registrations "the same" (re-registering the
    same function under its name is harmless, e.g. a module imported twice).
    """

    def __init__(
        self,
        kind: str,
        entry_points: Optional[EntryPointGroup] = None,
        *,
        error: Type[UnknownNameError] = UnknownNameError,
        identity: Callable[[Any], Any] = lambda entry: entry,
    ):
        self.kind = kind
        self.entry_points = entry_points
        self._error = error
        self._identity = identity
        self._entries: Dict[str, Any] = {}
        self._lock = threading.RLock()

    def add(self, name: str, entry: Any, *, override: bool = False) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        with self._lock:
            old = self._entries.get(name)
            if old is not None and not override and self._identity(old) is not self._identity(entry):
                raise ValueError(
                    f"{self.kind} {name!r} is already registered (by {_qualname(self._identity(old))}); "
                    f"pass override=True to replace it"
                )
            self._entries[name] = entry

    def register(self, name: str, *, override: bool = False) -> Callable[[Callable], Callable]:
        """Decorator registering a function under ``name``; a taken name raises unless ``override``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def decorator(fn: Callable) -> Callable:
            if not callable(fn):
                raise TypeError(f"cannot register non-callable {fn!r} as {self.kind} {name!r}")
            self.add(name, fn, override=override)
            return fn

        return decorator

    def unregister(self, name: str) -> None:
        """Remove ``name`` (for tests and plugins that replace themselves); missing names are ignored."""
        with self._lock:
            self._entries.pop(name, None)

    def _load(self) -> None:
        if self.entry_points is not None:
            self.entry_points.load()

    def get(self, name: str) -> Any:
        self._load()
        with self._lock:
            if name in self._entries:
                return self._entries[name]
            names = ", ".join(sorted(self._entries)) or "(none)"
        hint = self.entry_points.failure_hint() if self.entry_points is not None else ""
        raise self._error(f"unknown {self.kind} {name!r}; registered: {names}{hint}")

    def available(self) -> List[str]:
        self._load()
        with self._lock:
            return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load()
        with self._lock:
            return name in self._entries


def _qualname(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
