"""Forwarding module, kept for one release: the start-up hook an older install put in site-packages
(``rlhf_ext_startup.py``) runs ``from rlhf_ext.patches.startup import run``.

Start-up lives in :mod:`rlhf_ext.patches.activation.startup`; import from there.
"""

from .activation.startup import run

__all__ = ["run"]
