"""Version guard and all-or-nothing patching of MindSpeed-RL's seams.

The patch description (:class:`~rlhf_ext.seams.table.Patch`, ``Requirement``), the signature
check, the registry and the release check are every host's (:mod:`rlhf_ext.seams`); this module
keeps a registry of its own, so two hosts never patch or undo each other's modules.

MindSpeed-RL runs from a source checkout (it is not on PyPI), so its version is read from the
distribution metadata when it was installed, else from the ``setup.py`` beside the package.
Releases other than 2.1.x are refused unless ``RLHF_EXT_ALLOW_UNSUPPORTED_MINDSPEED_RL=1``; each
patch still checks the exact parameter lists it was written for either way.
"""

from __future__ import annotations

import importlib.util
import os
import re

from ...seams.host import REGISTRY_FUNCTIONS, HostRelease, distribution_version, registry_functions
from ...seams.table import Patch, Requirement

SUPPORTED_SERIES = ((2, 1),)
SUPPORTED_DESCRIPTION = "2.1.x (commit 05a90d77)"
ALLOW_UNSUPPORTED_ENV = "RLHF_EXT_ALLOW_UNSUPPORTED_MINDSPEED_RL"


class MindSpeedRLCompatibilityError(RuntimeError):
    """MindSpeed-RL does not have what an rlhf_ext patch was written against."""


def _read_version():
    """Distribution metadata, else ``__version`` in the ``setup.py`` beside the package (None: neither)."""
    candidate = distribution_version("mindspeed_rl", "mindspeed-rl")
    if candidate is not None and not candidate.startswith("0.0"):  # PyPI's name placeholder (0.0.1.dev1)
        return candidate
    spec = importlib.util.find_spec("mindspeed_rl")
    if spec is None or not spec.origin:
        return None
    setup_py = os.path.join(os.path.dirname(os.path.dirname(spec.origin)), "setup.py")
    try:
        with open(setup_py, encoding="utf-8") as f:
            match = re.search(r"""__version\s*=\s*['"]([^'"]+)['"]""", f.read())
    except OSError:
        return None
    return match.group(1) if match else None


RELEASE = HostRelease("MindSpeed-RL", SUPPORTED_SERIES, SUPPORTED_DESCRIPTION, ALLOW_UNSUPPORTED_ENV,
                      MindSpeedRLCompatibilityError, read_version=_read_version, in_use="in use",
                      missing="unknown (no metadata, no setup.py beside mindspeed_rl)")
# mindspeed_rl_version(): distribution metadata, else setup.py next to the package (read once per process).
mindspeed_rl_version, check_version = RELEASE.version, RELEASE.check
# register, apply_module, record, verify_all, ... and the registry's state for tests (_registry, _applied_modules)
__getattr__ = registry_functions(RELEASE.patch_registry(), __name__)

__all__ = ["ALLOW_UNSUPPORTED_ENV", "MindSpeedRLCompatibilityError", "Patch", "Requirement", "SUPPORTED_DESCRIPTION",
           "check_version", "mindspeed_rl_version", *REGISTRY_FUNCTIONS]
