"""Name -> function registries for advantage estimators, policy losses and KL estimators.

Modelled on verl's ``core_algos.py``: a decorator registers a function under a name, a getter
looks it up. Third-party packages add algorithms by declaring an entry point in the group
``rlhf_ext.algorithms`` whose value is a module; that module is imported on first registry
access, and its ``@register_*`` decorators do the rest::

    # in the third-party package's setup.py
    entry_points={"rlhf_ext.algorithms": ["my_algos = my_pkg.algos"]}
"""

from __future__ import annotations

import threading
import warnings
from importlib import metadata
from typing import Callable, Dict, List, Optional

ENTRY_POINT_GROUP = "rlhf_ext.algorithms"

_entry_points_lock = threading.RLock()
_entry_points_loaded = False
_entry_point_failures: Dict[str, str] = {}


def load_entry_points() -> Dict[str, str]:
    """Import every module declared in the ``rlhf_ext.algorithms`` entry point group, once.

    Returns the entry points that failed to load, ``{name: error}``. A broken third-party plugin
    is reported with a warning rather than breaking every registry lookup; a later lookup of a
    name it would have registered says that it failed.
    """
    global _entry_points_loaded
    with _entry_points_lock:
        if _entry_points_loaded:
            return dict(_entry_point_failures)
        # Set first: the modules we import call back into the registries.
        _entry_points_loaded = True
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                ep.load()
            except Exception as exc:  # a third party's bug must not take ours down
                _entry_point_failures[ep.name] = f"{type(exc).__name__}: {exc}"
                warnings.warn(
                    f"rlhf_ext: entry point {ep.name!r} ({ep.value}) in group "
                    f"{ENTRY_POINT_GROUP!r} failed to load: {type(exc).__name__}: {exc}",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return dict(_entry_point_failures)


class UnknownNameError(KeyError, ValueError):
    """An unknown algorithm name; a ``KeyError`` for lookups and a ``ValueError`` for argument parsers."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class Registry:
    """A thread-safe mapping from names to functions of one kind (e.g. "advantage estimator")."""

    def __init__(self, kind: str):
        self.kind = kind
        self._fns: Dict[str, Callable] = {}
        self._lock = threading.RLock()

    def register(self, name: str, *, override: bool = False) -> Callable[[Callable], Callable]:
        """Decorator registering ``fn`` under ``name``; a taken name raises unless ``override``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def decorator(fn: Callable) -> Callable:
            if not callable(fn):
                raise TypeError(f"cannot register non-callable {fn!r} as {self.kind} {name!r}")
            with self._lock:
                if name in self._fns and not override and self._fns[name] is not fn:
                    raise ValueError(
                        f"{self.kind} {name!r} is already registered "
                        f"(by {_qualname(self._fns[name])}); pass override=True to replace it"
                    )
                self._fns[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> Callable:
        load_entry_points()
        with self._lock:
            try:
                return self._fns[name]
            except KeyError:
                pass
            names = ", ".join(sorted(self._fns)) or "(none)"
        hint = ""
        if _entry_point_failures:
            failed = ", ".join(f"{k} ({v})" for k, v in sorted(_entry_point_failures.items()))
            hint = f"; these {ENTRY_POINT_GROUP} entry points failed to load: {failed}"
        raise UnknownNameError(f"unknown {self.kind} {name!r}; registered: {names}{hint}")

    def available(self) -> List[str]:
        load_entry_points()
        with self._lock:
            return sorted(self._fns)

    def __contains__(self, name: object) -> bool:
        load_entry_points()
        with self._lock:
            return name in self._fns


def _qualname(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


ADVANTAGES = Registry("advantage estimator")
POLICY_LOSSES = Registry("policy loss")
KL_ESTIMATORS = Registry("KL estimator")


def register_advantage(name: str, *, override: bool = False):
    """Register ``fn(scores: Tensor[P, N], **options) -> Tensor[P, N]`` under ``name``."""
    return ADVANTAGES.register(name, override=override)


def register_policy_loss(name: str, *, override: bool = False):
    """Register ``fn(log_probs, old_log_probs, advantages, mask, **options) -> (loss[B, T], metrics)``."""
    return POLICY_LOSSES.register(name, override=override)


def register_kl_estimator(name: str, *, override: bool = False):
    """Register ``fn(log_probs, ref_log_probs) -> Tensor[B, T]`` under ``name``."""
    return KL_ESTIMATORS.register(name, override=override)


def get_advantage(name: str) -> Callable:
    return ADVANTAGES.get(name)


def get_policy_loss(name: str) -> Callable:
    return POLICY_LOSSES.get(name)


def get_kl_estimator(name: str) -> Callable:
    return KL_ESTIMATORS.get(name)


def available_advantages() -> List[str]:
    return ADVANTAGES.available()


def available_policy_losses() -> List[str]:
    return POLICY_LOSSES.available()


def available_kl_estimators() -> List[str]:
    return KL_ESTIMATORS.available()


def _reset_entry_points_for_tests(loaded: Optional[bool] = False) -> None:
    """Forget which entry points were loaded (tests install a plugin package mid-session)."""
    global _entry_points_loaded
    with _entry_points_lock:
        _entry_points_loaded = bool(loaded)
        _entry_point_failures.clear()
