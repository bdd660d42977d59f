"""The options a policy loss takes: the clip knob's one name, its deprecated old name, and which of a
host's settings a registered loss accepts.

Every clipped loss names its clip range after verl's actor config keys, ``clip_ratio_low`` /
``clip_ratio_high``. Before, the PPO family (``ppo``, ``gspo``, ``ppo_clip_fractions``) called them
``eps_low`` / ``eps_high``; for one release both directions keep working, with a
:class:`DeprecationWarning`:

* a caller passing ``eps_low`` / ``eps_high`` to one of rlhf_ext's losses (:func:`accepts_old_clip_names`,
  on each loss with a clip range);
* a third-party loss that declares ``eps_low`` / ``eps_high`` (registered with
  :func:`rlhf_ext.algorithms.register_policy_loss`, e.g. through the ``rlhf_ext.algorithms`` entry
  point group) is registered behind an adapter (:func:`adapt_old_clip_names`) that takes the new names,
  so the hosts call every registered loss with ``clip_ratio_low`` / ``clip_ratio_high``.

Framework-free: the standard library only.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Callable, Dict, Iterable, Mapping, Optional

CLIP_LOW = "clip_ratio_low"
CLIP_HIGH = "clip_ratio_high"
# deprecated name -> the name it stands for (accepted for one release)
OLD_CLIP_NAMES = {"eps_low": CLIP_LOW, "eps_high": CLIP_HIGH}


def check_clip_range(low: float, high: Optional[float], loss: str) -> float:
    """Check a PPO-style clip range ``[1 - low, 1 + high]``; returns ``high`` (``low`` when None).
    The messages name both names of each knob while the old one is accepted."""
    if high is None:
        high = low
    if not (0 <= low < 1):
        raise ValueError(f"{loss}: clip_ratio_low / eps_low must be in [0, 1), got {low!r}")
    if not high >= 0:
        raise ValueError(f"{loss}: clip_ratio_high / eps_high must be >= 0, got {high!r}")
    return high


def _old_names_warning(who: str, old: Iterable[str], stacklevel: int) -> None:
    renamed = ", ".join(f"{name} -> {OLD_CLIP_NAMES[name]}" for name in sorted(old))
    warnings.warn(f"{who}: the clip options are named after verl's keys now ({renamed}); the old names are "
                  "accepted for one release", DeprecationWarning, stacklevel=stacklevel + 1)


def renamed_clip_options(kwargs: Dict[str, object], loss: str, *, stacklevel: int = 2) -> Dict[str, object]:
    """``kwargs`` with ``eps_low`` / ``eps_high`` renamed ``clip_ratio_low`` / ``clip_ratio_high`` (with a
    DeprecationWarning); a knob given under both names is an error."""
    old = [name for name in OLD_CLIP_NAMES if name in kwargs]
    if not old:
        return kwargs
    _old_names_warning(loss, old, stacklevel + 1)
    kwargs = dict(kwargs)
    for name in old:
        new = OLD_CLIP_NAMES[name]
        if new in kwargs:
            raise TypeError(f"{loss}: got both {new} and its old name {name}")
        kwargs[new] = kwargs.pop(name)
    return kwargs


def accepts_old_clip_names(fn: Callable) -> Callable:
    """Decorator for a loss whose clip range is ``clip_ratio_low`` / ``clip_ratio_high``: a call with
    ``eps_low`` / ``eps_high`` still works (DeprecationWarning). The signature seen by ``inspect`` is
    the loss's own."""
    name = fn.__name__

    @functools.wraps(fn)
    def loss(*args, **kwargs):
        if "eps_low" in kwargs or "eps_high" in kwargs:
            kwargs = renamed_clip_options(kwargs, name, stacklevel=3)
        return fn(*args, **kwargs)

    return loss


def adapt_old_clip_names(fn: Callable, name: str, *, stacklevel: int = 2) -> Callable:
    """``fn`` if it does not declare ``eps_low`` / ``eps_high``; otherwise (a loss written before the
    rename; DeprecationWarning) an adapter that takes ``clip_ratio_low`` / ``clip_ratio_high`` under
    those names, hands them to ``fn`` as ``eps_low`` / ``eps_high``, and shows the new names to
    ``inspect`` (what a host reads to know a loss has a clip range)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to read
        return fn
    params = signature.parameters
    old = [p for p in OLD_CLIP_NAMES if p in params and OLD_CLIP_NAMES[p] not in params]
    if not old:
        return fn
    _old_names_warning(f"policy loss {name!r} ({getattr(fn, '__module__', '?')})", old, stacklevel + 1)
    to_old = {OLD_CLIP_NAMES[p]: p for p in old}

    @functools.wraps(fn)
    def adapter(*args, **kwargs):
        for new, before in to_old.items():
            if new in kwargs:
                if before in kwargs:
                    raise TypeError(f"policy loss {name!r}: got both {new} and its old name {before}")
                kwargs[before] = kwargs.pop(new)
        return fn(*args, **kwargs)

    adapter.__signature__ = signature.replace(parameters=[
        p.replace(name=OLD_CLIP_NAMES[p.name]) if p.name in old else p for p in params.values()])
    return adapter


def accepted_options(fn: Callable, options: Mapping[str, object], *,
                     forwarded: Iterable[str] = ()) -> Dict[str, object]:
    """The entries of a host's ``options`` that the loss ``fn`` takes: those it names, and for a loss
    taking ``**kwargs`` also those in ``forwarded`` (what a loss forwarding to :func:`ppo` expects)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        forwarded = set(forwarded)
        return {k: v for k, v in options.items() if k in params or k in forwarded}
    return {k: v for k, v in options.items() if k in params}


__all__ = ["CLIP_HIGH", "CLIP_LOW", "OLD_CLIP_NAMES", "accepted_options", "accepts_old_clip_names",
           "adapt_old_clip_names", "check_clip_range", "renamed_clip_options"]
