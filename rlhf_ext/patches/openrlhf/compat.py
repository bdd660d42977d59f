"""Version guard and all-or-nothing patching of OpenRLHF's seams.

Every patch names the object it replaces and the exact parameter list it was written against.
Before a module's patches are applied, all of them (and the helpers they call) are checked; a
single mismatch raises :class:`OpenRLHFCompatibilityError` naming the installed OpenRLHF version
and the patch, and nothing in that module is replaced. The driver checks every module at
start-up (:func:`verify_all`), so a mismatch stops the run before any Ray actor exists. The
machinery is shared by every host (:mod:`rlhf_ext.seams.table`, :mod:`rlhf_ext.seams.host`);
this module holds OpenRLHF's version rule and its own registry.
"""

from __future__ import annotations

from ...seams.host import REGISTRY_FUNCTIONS, HostRelease, registry_functions
from ...seams.table import PATCHED_MARK, Patch, Requirement, is_patched

SUPPORTED_SERIES = ((0, 11),)
SUPPORTED_DESCRIPTION = "0.11.x"
ALLOW_UNSUPPORTED_ENV = "RLHF_EXT_ALLOW_UNSUPPORTED_OPENRLHF"


class OpenRLHFCompatibilityError(RuntimeError):
    """The installed OpenRLHF does not have what an rlhf_ext patch was written against."""


RELEASE = HostRelease("OpenRLHF", SUPPORTED_SERIES, SUPPORTED_DESCRIPTION, ALLOW_UNSUPPORTED_ENV,
                      OpenRLHFCompatibilityError, distribution="openrlhf", install_hint="install openrlhf==0.11.2")
# openrlhf_version(): the installed version, from its distribution metadata (read once per process).
# check_version(): raise unless OpenRLHF is a supported release (RLHF_EXT_ALLOW_UNSUPPORTED_OPENRLHF=1
# overrides; the per-patch signature checks still run then).
openrlhf_version, check_version = RELEASE.version, RELEASE.check
# register, apply_module, verify_all, ... and the registry's state for tests (_registry, _applied_modules)
__getattr__ = registry_functions(RELEASE.patch_registry(), __name__)

__all__ = ["ALLOW_UNSUPPORTED_ENV", "PATCHED_MARK", "SUPPORTED_DESCRIPTION", "OpenRLHFCompatibilityError", "Patch",
           "Requirement", "check_version", "is_patched", "openrlhf_version", *REGISTRY_FUNCTIONS]
