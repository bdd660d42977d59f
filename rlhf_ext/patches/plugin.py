"""Forwarding module, kept for one release: Ray jobs started by an older rlhf_ext carry
``worker_process_setup_hook = "rlhf_ext.patches.plugin.ray_worker_setup"`` in their runtime env.

Activation lives in :mod:`rlhf_ext.patches.activation.plugin`; import from there.
"""

from .activation.plugin import activate, activate_rlhf_ext, ray_worker_setup

__all__ = ["activate", "activate_rlhf_ext", "ray_worker_setup"]
