"""Version guard and all-or-nothing patching of OpenRLHF's seams.

Every patch names the object it replaces and the exact parameter list it was written against.
Before a module's patches are applied, all of them (and the helpers they call) are checked; a
single mismatch raises :class:`OpenRLHFCompatibilityError` naming the installed OpenRLHF version
and the patch, and nothing in that module is replaced. The driver checks every module at
start-up (:func:`verify_all`), so a mismatch stops the run before any Ray actor exists. The
machinery is shared by every host (:mod:`rlhf_ext.patches.seams`); this module holds OpenRLHF's
version rule and its own registry.
"""

from __future__ import annotations

from ..seams import PATCHED_MARK, Patch, PatchRegistry, Requirement, is_patched, version_allowed

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms at start-up
if TYPE_CHECKING:
    from typing import Optional

SUPPORTED_SERIES = ((0, 11),)
SUPPORTED_DESCRIPTION = "0.11.x"
ALLOW_UNSUPPORTED_ENV = "RLHF_EXT_ALLOW_UNSUPPORTED_OPENRLHF"


class OpenRLHFCompatibilityError(RuntimeError):
    """The installed OpenRLHF does not have what an rlhf_ext patch was written against."""


_version_cache: list = []


def openrlhf_version() -> str:
    """The installed OpenRLHF's version, from its distribution metadata (read once per process)."""
    if not _version_cache:
        from importlib import metadata

        try:
            _version_cache.append(metadata.version("openrlhf"))
        except metadata.PackageNotFoundError:
            _version_cache.append("unknown (no 'openrlhf' distribution metadata)")
    return _version_cache[0]


def check_version(version: Optional[str] = None) -> str:
    """Raise unless OpenRLHF is a supported release (``RLHF_EXT_ALLOW_UNSUPPORTED_OPENRLHF=1`` overrides;
    the per-patch signature checks still run then)."""
    version = openrlhf_version() if version is None else version
    if version_allowed(version, SUPPORTED_SERIES, ALLOW_UNSUPPORTED_ENV):
        return version
    raise OpenRLHFCompatibilityError(
        f"rlhf_ext supports OpenRLHF {SUPPORTED_DESCRIPTION}, but OpenRLHF {version} is installed; "
        f"install openrlhf==0.11.2, or set {ALLOW_UNSUPPORTED_ENV}=1 to try anyway (every patch still "
        f"checks the signatures it needs)"
    )


_patches = PatchRegistry("OpenRLHF", check_version, OpenRLHFCompatibilityError)
# The registry's state, for tests that reset one module of it.
_registry, _applied_modules = _patches._registry, _patches._applied_modules

register = _patches.register
patch_modules = _patches.patch_modules
check_module = _patches.check_module
apply_module = _patches.apply_module
applied = _patches.applied
original = _patches.original
undo_all = _patches.undo_all
verify_all = _patches.verify_all

__all__ = [
    "ALLOW_UNSUPPORTED_ENV",
    "PATCHED_MARK",
    "SUPPORTED_DESCRIPTION",
    "OpenRLHFCompatibilityError",
    "Patch",
    "Requirement",
    "applied",
    "apply_module",
    "check_module",
    "check_version",
    "is_patched",
    "openrlhf_version",
    "original",
    "patch_modules",
    "register",
    "undo_all",
    "verify_all",
]
