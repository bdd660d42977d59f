"""Version and signature checks for the OpenRLHF retarget.

Every patch names the OpenRLHF attribute it replaces and the parameters it relies on; if a
release renames or reshapes one, applying the retarget raises :class:`RetargetError` naming the
patch, the attribute and the installed OpenRLHF version, instead of patching the wrong thing or
nothing at all.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Iterable, Optional

from rlhf_ext.seams.host import distribution_version

logger = logging.getLogger("rlhf_ext.retarget")

TESTED_OPENRLHF_VERSIONS = ("0.11.2",)
_MISSING = object()
_warned_version = False


class RetargetError(RuntimeError):
    """The OpenRLHF device retarget cannot be applied or cannot do what was asked."""


def openrlhf_version() -> str:
    return distribution_version("openrlhf") or "unknown (openrlhf not installed as a distribution)"


def warn_if_untested_version() -> None:
    """Log once when the installed OpenRLHF is not a version the retarget was tested with."""
    global _warned_version
    if _warned_version:
        return
    _warned_version = True
    version = openrlhf_version()
    if version not in TESTED_OPENRLHF_VERSIONS:
        logger.warning(
            "rlhf_ext's NPU/CPU retarget was tested with OpenRLHF %s, found %s; each patch checks its target "
            "and fails loudly if it moved (run `python -m rlhf_ext.patches.retarget` to list new sites)",
            ", ".join(TESTED_OPENRLHF_VERSIONS),
            version,
        )


def _fail(patch: str, what: str) -> RetargetError:
    return RetargetError(
        f"rlhf_ext retarget patch '{patch}': {what} in the installed OpenRLHF {openrlhf_version()} "
        f"(the patch was written for OpenRLHF {', '.join(TESTED_OPENRLHF_VERSIONS)}). Install a tested "
        "OpenRLHF version, or update rlhf_ext/patches/retarget for this one."
    )


def require(owner: Any, attribute: str, patch: str, params: Optional[Iterable[str]] = None) -> Any:
    """``owner.<attribute>`` (a dotted path), checked to exist and to accept ``params`` by name."""
    value = owner
    for part in attribute.split("."):
        value = getattr(value, part, _MISSING)
        if value is _MISSING:
            owner_name = getattr(owner, "__name__", repr(owner))
            raise _fail(patch, f"{owner_name}.{attribute} does not exist")
    if params:
        try:
            signature = inspect.signature(value)
        except (TypeError, ValueError) as exc:
            raise _fail(patch, f"cannot read the signature of {attribute} ({exc})") from exc
        missing = [name for name in params if name not in signature.parameters]
        if missing:
            raise _fail(patch, f"{attribute}{signature} has no parameter(s) {', '.join(missing)}")
    return value


def ray_actor_class_body(actor_class: Any, patch: str) -> type:
    """The user class behind a ``@ray.remote`` class (where its methods live)."""
    metadata = getattr(actor_class, "__ray_metadata__", None)
    modified = getattr(metadata, "modified_class", None)
    original = getattr(modified, "__ray_actor_class__", None)
    if not isinstance(original, type):
        raise _fail(patch, f"{actor_class!r} is not a Ray actor class")
    return original


def ray_actor_method_owners(actor_class: Any, patch: str) -> tuple:
    """``(wrapper class, user class)`` of a ``@ray.remote`` class: a method patch must go on both.

    When a class is declared an actor, Ray builds a subclass that copies every method of the user
    class into its own dict, wrapped for tracing (``ray/util/tracing/tracing_helper.py``), and the
    actor's calls find those copies first. A method replaced only on the user class is never called
    by Ray; the user class is patched too for code that calls it directly.
    """
    body = ray_actor_class_body(actor_class, patch)
    return actor_class.__ray_metadata__.modified_class, body


__all__ = [
    "RetargetError",
    "TESTED_OPENRLHF_VERSIONS",
    "openrlhf_version",
    "ray_actor_class_body",
    "ray_actor_method_owners",
    "require",
    "warn_if_untested_version",
]
