"""Framework glue: the ``rlhf_ext`` plugin for OpenRLHF and MindSpeed-RL (start-up hook, flags, patched seams).

MindSpeed-RL's glue is :mod:`rlhf_ext.patches.mindspeed_rl` (``--plugin rlhf_ext`` on its
``cli/train_*.py``, see docs/mindspeed_rl.md); the rest of this docstring is about OpenRLHF.

Users add ``--plugin rlhf_ext`` to an OpenRLHF command line (or set ``RLHF_EXT_PLUGINS=rlhf_ext``);
the start-up hook installed with the package activates the plugin in the driver and, through the
environment, Ray's ``worker_process_setup_hook`` and vLLM's ``vllm.general_plugins`` entry
point, in every process the run starts (all of it in :mod:`rlhf_ext.patches.activation`). Code can
do the same explicitly::

    from rlhf_ext.patches import activate
    activate(["rlhf_ext"])

verl needs none of this: it loads :mod:`rlhf_ext.patches.verl` through its own ``verl.plugins``
entry point (docs/verl.md).

Framework-free math stays in :mod:`rlhf_ext.algorithms` and :mod:`rlhf_ext.rewards`; only this
package knows OpenRLHF's and verl's internals (see docs/openrlhf_plugin.md). Importing it is cheap: nothing
here imports torch, OpenRLHF or Ray until a patched module is imported.
"""

from .flash_attn_fallback import install as install_flash_attn_fallback
from .activation.plugin import (
    ENV_VAR,
    UnknownPluginError,
    activate,
    active_plugins,
    available_plugins,
    detect_role,
    is_active,
    ray_worker_setup,
    register_plugin,
)


def deactivate() -> None:
    """Undo the ``rlhf_ext`` plugin in this process and forget all activations (for tests only)."""
    import os

    from . import mindspeed_rl, openrlhf
    from .activation import plugin

    openrlhf.deactivate()
    mindspeed_rl.deactivate()
    plugin._forget_for_tests()
    os.environ.pop(ENV_VAR, None)


__all__ = [
    "ENV_VAR",
    "UnknownPluginError",
    "activate",
    "active_plugins",
    "available_plugins",
    "deactivate",
    "detect_role",
    "install_flash_attn_fallback",
    "is_active",
    "ray_worker_setup",
    "register_plugin",
]
