"""Name -> reward function registry, with third-party rewards through entry points.

Built on :mod:`rlhf_ext.ground.registry` (torch-free, so a grader worker never imports torch).
A reward function takes Open-R1's form::

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

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from rlhf_ext.ground.registry import EntryPointGroup, Registry, UnknownNameError

ENTRY_POINT_GROUP = "rlhf_ext.rewards"
ENTRY_POINTS = EntryPointGroup(ENTRY_POINT_GROUP)


class UnknownRewardError(UnknownNameError):
    """An unknown reward name; a ``KeyError`` for lookups and a ``ValueError`` for argument parsers."""


@dataclass(frozen=True)
class RewardEntry:
    """A registered reward: the function, whether it needs the grader's verdicts (``grades``),
    whether each sample's value depends on that sample alone (``per_sample``), and optionally its
    one-sample form ``one(text, grade, truncated) -> float`` (``grade``: the sample's verdict or None,
    ``truncated``: its flag or None), the value ``fn`` gives that sample, for a reward without options:
    OpenRLHF calls the reward file once per sample, where the list form's checks cost more than the
    value (:meth:`~rlhf_ext.rewards.composite.WeightedReward.score_one`)."""

    name: str
    fn: Callable
    uses_correctness: bool
    per_sample: bool = False
    one: Optional[Callable] = None


REWARDS = Registry("reward", ENTRY_POINTS, error=UnknownRewardError, identity=lambda entry: entry.fn)


def load_entry_points() -> Dict[str, str]:
    """Import every module of the ``rlhf_ext.rewards`` entry point group once; returns ``{name: error}`` of failures."""
    return ENTRY_POINTS.load()


def register_reward(name: str, *, uses_correctness: bool = False, per_sample: bool = False, override: bool = False,
                    one: Optional[Callable] = None):
    """Decorator registering ``fn(completions, solution=None, **kwargs) -> list[float]`` under ``name``.

    ``uses_correctness``: the function reads ``kwargs["grades"]``; a weighted combination then grades
    the batch once and shares the verdicts among all such rewards.
    ``per_sample``: each sample's value depends on that sample alone (not on the rest of its batch,
    as Kimi's ``length`` does); such rewards may be computed over several callers' samples at once.
    Leave it False when unsure: the reward is then always computed over exactly its caller's batch.
    ``one``: the one-sample form of a ``per_sample`` reward (see :class:`RewardEntry`); it must give
    exactly what the list form gives that sample.
    """
    if not isinstance(name, str) or not name or any(c in name for c in ",: ="):
        raise ValueError(f"reward name must be a non-empty string without ',', ':', '=' or spaces, got {name!r}")

    if one is not None and (not callable(one) or not per_sample):
        raise ValueError(f"reward {name!r}: one= must be a callable, and only for a per_sample reward")

    def decorator(fn: Callable) -> Callable:
        if not callable(fn):
            raise TypeError(f"cannot register non-callable {fn!r} as reward {name!r}")
        REWARDS.add(name, RewardEntry(name, fn, bool(uses_correctness), bool(per_sample), one), override=override)
        return fn

    return decorator


def get_reward_entry(name: str) -> RewardEntry:
    return REWARDS.get(name)


def get_reward(name: str) -> Callable:
    """The reward function registered under ``name``; :class:`UnknownRewardError` lists the known names."""
    return get_reward_entry(name).fn


def available_rewards() -> List[str]:
    return REWARDS.available()
