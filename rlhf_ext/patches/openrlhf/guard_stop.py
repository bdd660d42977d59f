"""How a non-finite guard stop looks from outside the actor: its exception, marker and exit code.

The guard (:mod:`rlhf_ext.patches.openrlhf.guard`) raises :class:`GuardStop` on every actor rank;
the driver's run record (:mod:`rlhf_ext.patches.openrlhf.run_record`) recognises it -- after Ray
has wrapped and chained it -- and exits with :data:`GUARD_EXIT_CODE`. Both read this module, so
the run record needs nothing (and no torch) from the guard itself.
"""

from __future__ import annotations

GUARD_EXIT_CODE = 3
"""Exit code of ``train_ppo_ray`` when the guard stopped the run (1 is any other crash, 2 a bad flag)."""
STOP_MARKER = "rlhf_ext guard stop"


class GuardStop(RuntimeError):
    """Raised on every actor rank when the guard stops the run (message starts with :data:`STOP_MARKER`)."""


def is_guard_stop(exc: BaseException) -> bool:
    """True if ``exc`` (possibly wrapped by Ray, possibly chained) comes from a guard stop."""
    seen = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, GuardStop) or STOP_MARKER in str(e):
            return True
        stack.extend([getattr(e, "cause", None), e.__cause__, e.__context__])
    return False


__all__ = ["GUARD_EXIT_CODE", "STOP_MARKER", "GuardStop", "is_guard_stop"]
