"""Version guard and all-or-nothing patching of MindSpeed-RL's seams.

The patch description (:class:`~rlhf_ext.patches.openrlhf.compat.Patch`, ``Requirement``) and the
signature check are OpenRLHF's (:mod:`rlhf_ext.patches.openrlhf.compat`); this module keeps a
registry of its own, so the two hosts never patch or undo each other's modules.

MindSpeed-RL runs from a source checkout (it is not on PyPI), so its version is read from the
distribution metadata when it was installed, else from the ``setup.py`` beside the package.
Releases other than 2.1.x are refused unless ``RLHF_EXT_ALLOW_UNSUPPORTED_MINDSPEED_RL=1``; each
patch still checks the exact parameter lists it was written for either way.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import threading

from ..openrlhf.compat import PATCHED_MARK, Patch, Requirement, _problems, _resolve

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

SUPPORTED_SERIES = ((2, 1),)
SUPPORTED_DESCRIPTION = "2.1.x (commit 05a90d77)"
ALLOW_UNSUPPORTED_ENV = "RLHF_EXT_ALLOW_UNSUPPORTED_MINDSPEED_RL"


class MindSpeedRLCompatibilityError(RuntimeError):
    """MindSpeed-RL does not have what an rlhf_ext patch was written against."""


_version_cache: list = []


def mindspeed_rl_version() -> str:
    """MindSpeed-RL's version: distribution metadata, else ``setup.py`` next to the package."""
    if _version_cache:
        return _version_cache[0]
    from importlib import metadata

    version = None
    for dist in ("mindspeed_rl", "mindspeed-rl"):
        try:
            candidate = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        if not candidate.startswith("0.0"):  # PyPI's name placeholder (0.0.1.dev1) is not MindSpeed-RL
            version = candidate
            break
    if version is None:
        spec = importlib.util.find_spec("mindspeed_rl")
        if spec is not None and spec.origin:
            setup_py = os.path.join(os.path.dirname(os.path.dirname(spec.origin)), "setup.py")
            try:
                with open(setup_py, encoding="utf-8") as f:
                    match = re.search(r"""__version\s*=\s*['"]([^'"]+)['"]""", f.read())
                version = match.group(1) if match else None
            except OSError:
                version = None
    _version_cache.append(version or "unknown (no metadata, no setup.py beside mindspeed_rl)")
    return _version_cache[0]


def _series(version: str) -> Optional[Tuple[int, int]]:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return None


def check_version(version: Optional[str] = None) -> str:
    version = mindspeed_rl_version() if version is None else version
    if _series(version) in SUPPORTED_SERIES or os.environ.get(ALLOW_UNSUPPORTED_ENV, "") not in ("", "0"):
        return version
    raise MindSpeedRLCompatibilityError(
        f"rlhf_ext supports MindSpeed-RL {SUPPORTED_DESCRIPTION}, but MindSpeed-RL {version} is in use; "
        f"set {ALLOW_UNSUPPORTED_ENV}=1 to try anyway (every patch still checks the signatures it needs)"
    )


_lock = threading.RLock()
_registry: Dict[str, List[Patch]] = {}
_applied: List[Tuple[object, str, object, object]] = []
_applied_modules: Dict[str, List[str]] = {}


def register(patch: Patch) -> None:
    with _lock:
        _registry.setdefault(patch.module, []).append(patch)


def patch_modules() -> List[str]:
    with _lock:
        return list(_registry)


def check_module(module) -> List[str]:
    with _lock:
        patches = list(_registry.get(module.__name__, []))
    problems = []
    for patch in patches:
        problems.extend(f"patch '{patch.name}': {p}" for p in _problems(module, patch))
    return problems


def apply_module(module) -> List[str]:
    """Check, then apply, every patch registered for ``module``; all or none."""
    name = module.__name__
    with _lock:
        if name in _applied_modules:
            return _applied_modules[name]
        version = check_version()
        problems = check_module(module)
        if problems:
            raise MindSpeedRLCompatibilityError(
                f"rlhf_ext cannot patch MindSpeed-RL {version} ({name}); nothing in that module was changed:\n  "
                + "\n  ".join(problems)
            )
        patches = list(_registry.get(name, []))
        factories = [patch.factory() for patch in patches]
        done = []
        for patch, make in zip(patches, factories):
            owner, attr, original = _resolve(module, patch.target)
            replacement = make(original, module)
            try:
                setattr(replacement, PATCHED_MARK, patch.name)
            except (AttributeError, TypeError):
                pass
            setattr(owner, attr, replacement)
            _applied.append((owner, attr, original, replacement))
            done.append(patch.name)
        _applied_modules[name] = done
        return done


def applied() -> Dict[str, List[str]]:
    with _lock:
        return {k: list(v) for k, v in _applied_modules.items()}


def original(owner, attr: str):
    """The object a patch replaced at ``owner.attr``."""
    with _lock:
        for o, a, orig, _ in _applied:
            if o is owner and a == attr:
                return orig
    raise KeyError(f"{getattr(owner, '__name__', owner)}.{attr} is not patched")


def undo_all() -> None:
    with _lock:
        while _applied:
            owner, attr, orig, _ = _applied.pop()
            setattr(owner, attr, orig)
        _applied_modules.clear()


def verify_all() -> Dict[str, List[str]]:
    """Import every patched MindSpeed-RL module (applying its patches); raise on the first mismatch."""
    check_version()
    for name in patch_modules():
        apply_module(importlib.import_module(name))
    return applied()


__all__ = [
    "ALLOW_UNSUPPORTED_ENV",
    "MindSpeedRLCompatibilityError",
    "Patch",
    "Requirement",
    "SUPPORTED_DESCRIPTION",
    "applied",
    "apply_module",
    "check_version",
    "mindspeed_rl_version",
    "original",
    "undo_all",
    "verify_all",
]
