"""Name -> reward function registry, with third-party rewards through entry points.

Same shape as :mod:`rlhf_ext.algorithms.registry` (kept separate so that importing the rewards,
e.g. in a grader worker, never imports torch). A reward function takes Open-R1's form::

    @register_reward("my_reward")
    def my_reward(completions: list[str], solution: list[str] | None = None, **kwargs) -> list[float]: ...

``kwargs`` carries what the caller knows about each sample (``truncated``, ``completion_lengths``,
and ``grades`` -- one :class:`~rlhf_ext.rewards.GradeResult` per sample -- for rewards registered
with ``uses_correctness=True``) plus the reward's own options; ignore what you do not use.

Third-party packages declare an entry point in the group ``rlhf_ext.rewards`` whose value is a
module; it is imported on first registry access and its ``@register_reward`` decorators run::

    entry_points={"rlhf_ext.rewards": ["my_rewards = my_pkg.rewards"]}
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from importlib import metadata
from typing import Callable, Dict, List

ENTRY_POINT_GROUP = "rlhf_ext.rewards"

_entry_points_lock = threading.RLock()
_entry_points_loaded = False
_entry_point_failures: Dict[str, str] = {}


class UnknownRewardError(KeyError, ValueError):
    """An unknown reward name; a ``KeyError`` for lookups and a ``ValueError`` for argument parsers."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class RewardEntry:
    """A registered reward: the function and whether it needs the grader's verdicts (``grades``)."""

    name: str
    fn: Callable
    uses_correctness: bool


_REWARDS: Dict[str, RewardEntry] = {}
_lock = threading.RLock()


def load_entry_points() -> Dict[str, str]:
    """Import every module of the ``rlhf_ext.rewards`` entry point group once; returns ``{name: error}`` of failures."""
    global _entry_points_loaded
    with _entry_points_lock:
        if _entry_points_loaded:
            return dict(_entry_point_failures)
        _entry_points_loaded = True  # first: the modules we import call register_reward
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                ep.load()
            except Exception as exc:  # a third party's bug must not take our rewards down
                _entry_point_failures[ep.name] = f"{type(exc).__name__}: {exc}"
                warnings.warn(
                    f"rlhf_ext: entry point {ep.name!r} ({ep.value}) in group {ENTRY_POINT_GROUP!r} failed to "
                    f"load: {type(exc).__name__}: {exc}",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return dict(_entry_point_failures)


def register_reward(name: str, *, uses_correctness: bool = False, override: bool = False):
    """Decorator registering ``fn(completions, solution=None, **kwargs) -> list[float]`` under ``name``.

    ``uses_correctness``: the function reads ``kwargs["grades"]``; a weighted combination then grades
    the batch once and shares the verdicts among all such rewards.
    """
    if not isinstance(name, str) or not name or any(c in name for c in ",: ="):
        raise ValueError(f"reward name must be a non-empty string without ',', ':', '=' or spaces, got {name!r}")

    def decorator(fn: Callable) -> Callable:
        if not callable(fn):
            raise TypeError(f"cannot register non-callable {fn!r} as reward {name!r}")
        with _lock:
            old = _REWARDS.get(name)
            if old is not None and not override and old.fn is not fn:
                raise ValueError(f"reward {name!r} is already registered (by {old.fn.__module__}."
                                 f"{old.fn.__qualname__}); pass override=True to replace it")
            _REWARDS[name] = RewardEntry(name, fn, bool(uses_correctness))
        return fn

    return decorator


def get_reward_entry(name: str) -> RewardEntry:
    load_entry_points()
    with _lock:
        entry = _REWARDS.get(name)
        if entry is not None:
            return entry
        names = ", ".join(sorted(_REWARDS)) or "(none)"
    hint = ""
    if _entry_point_failures:
        failed = ", ".join(f"{k} ({v})" for k, v in sorted(_entry_point_failures.items()))
        hint = f"; these {ENTRY_POINT_GROUP} entry points failed to load: {failed}"
    raise UnknownRewardError(f"unknown reward {name!r}; registered: {names}{hint}")


def get_reward(name: str) -> Callable:
    """The reward function registered under ``name``; :class:`UnknownRewardError` lists the known names."""
    return get_reward_entry(name).fn


def available_rewards() -> List[str]:
    load_entry_points()
    with _lock:
        return sorted(_REWARDS)


def _reset_entry_points_for_tests(loaded: bool = False) -> None:
    global _entry_points_loaded
    with _entry_points_lock:
        _entry_points_loaded = bool(loaded)
        _entry_point_failures.clear()
