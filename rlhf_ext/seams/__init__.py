"""The seam mechanism (the patching tools) every host's glue and the device shims share; framework-free, the ground floor.

* :mod:`.import_hooks` -- run a callback right after a named module is imported (post-import hooks);
* :mod:`.ledger` -- the replacement ledger: every attribute replaced, its original, undo;
* :mod:`.table` -- a host's patch table: :class:`Patch` (target + parameter list), :class:`Requirement`,
  :class:`PatchRegistry` (checked, then applied all or none);
* :mod:`.host` -- a host's release rule (:class:`HostRelease`) and its registry's functions at
  module level (:func:`registry_functions`).

Nothing here imports another part of rlhf_ext, torch or a framework: activation imports this at
interpreter start-up. The ledger (which needs :mod:`inspect` and :mod:`dataclasses`) is not
imported by this ``__init__``; ``from rlhf_ext.seams import ledger`` when it is needed.
"""

from .host import HostRelease, registry_functions
from .import_hooks import when_imported
from .table import Patch, PatchRegistry, Requirement, version_allowed

__all__ = ["HostRelease", "Patch", "PatchRegistry", "Requirement", "registry_functions", "version_allowed",
           "when_imported"]  # fmt: skip
