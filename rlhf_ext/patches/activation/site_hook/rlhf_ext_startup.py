"""rlhf_ext start-up hook, imported by ``rlhf_ext_startup.pth`` when a plugin may be requested.

Installed as a top-level module by rlhf_ext's setup.py (source: rlhf_ext/patches/activation/site_hook/). The
.pth line imports it only when ``RLHF_EXT_PLUGINS`` is set or ``--plugin`` appears somewhere in
``sys.argv``; this module checks precisely and hands over to :mod:`rlhf_ext.patches.activation.startup`.
"""

import os
import sys


def _requested():
    if os.environ.get("RLHF_EXT_PLUGINS"):
        return True
    for arg in sys.argv:
        if arg == "--plugin" or arg.startswith("--plugin="):
            return True
    return False


if _requested():
    from rlhf_ext.patches.activation.startup import run

    run()
