"""Version guard and all-or-nothing patching of MindSpeed-RL's seams.

The patch description (:class:`~rlhf_ext.patches.seams.Patch`, ``Requirement``), the signature
check and the registry are every host's (:mod:`rlhf_ext.patches.seams`); this module keeps a
registry of its own, so two hosts never patch or undo each other's modules.

MindSpeed-RL runs from a source checkout (it is not on PyPI), so its version is read from the
distribution metadata when it was installed, else from the ``setup.py`` beside the package.
Releases other than 2.1.x are refused unless ``RLHF_EXT_ALLOW_UNSUPPORTED_MINDSPEED_RL=1``; each
patch still checks the exact parameter lists it was written for either way.
"""

from __future__ import annotations

import importlib.util
import os
import re

from ..seams import Patch, PatchRegistry, Requirement, version_allowed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

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


def check_version(version: Optional[str] = None) -> str:
    version = mindspeed_rl_version() if version is None else version
    if version_allowed(version, SUPPORTED_SERIES, ALLOW_UNSUPPORTED_ENV):
        return version
    raise MindSpeedRLCompatibilityError(
        f"rlhf_ext supports MindSpeed-RL {SUPPORTED_DESCRIPTION}, but MindSpeed-RL {version} is in use; "
        f"set {ALLOW_UNSUPPORTED_ENV}=1 to try anyway (every patch still checks the signatures it needs)"
    )


_patches = PatchRegistry("MindSpeed-RL", check_version, MindSpeedRLCompatibilityError)
# The registry's state, for tests that reset one module of it.
_registry, _applied_modules = _patches._registry, _patches._applied_modules

register = _patches.register
patch_modules = _patches.patch_modules
check_module = _patches.check_module
apply_module = _patches.apply_module
record = _patches.record
applied = _patches.applied
original = _patches.original
undo_all = _patches.undo_all
verify_all = _patches.verify_all


__all__ = [
    "ALLOW_UNSUPPORTED_ENV",
    "MindSpeedRLCompatibilityError",
    "Patch",
    "Requirement",
    "SUPPORTED_DESCRIPTION",
    "applied",
    "apply_module",
    "check_module",
    "check_version",
    "mindspeed_rl_version",
    "original",
    "patch_modules",
    "record",
    "register",
    "undo_all",
    "verify_all",
]
