"""Activation, in one room: how the ``rlhf_ext`` plugin gets into every process of a run.

* :mod:`.site_hook` -- the ``rlhf_ext_startup.pth`` / ``rlhf_ext_startup.py`` pair setup.py installs
  at the top of site-packages (imports nothing unless ``--plugin`` or ``RLHF_EXT_PLUGINS`` is seen);
* :mod:`.startup` -- what that hook runs: ``--plugin NAME`` taken off a host's command line;
* :mod:`.command_line` -- whose command line this is (OpenRLHF's, MindSpeed-RL's, neither);
* :mod:`.plugin` -- the plugin registry, :func:`activate` (idempotent, exports ``RLHF_EXT_PLUGINS``),
  the ``rlhf_ext`` plugin itself and Ray's ``worker_process_setup_hook``;
* :mod:`.vllm_plugin` -- vLLM's ``vllm.general_plugins`` entry point;
* :mod:`.ray_env` -- the Ray environment carriage: ``ray.init`` gets the plugin's runtime env, for
  every host that starts Ray.

verl activates through its own ``verl.plugins`` entry point (:mod:`rlhf_ext.patches.verl.plugin`).
Old installs name three earlier paths -- the ``.pth`` hook's ``rlhf_ext.patches.startup``, the vLLM
entry point ``rlhf_ext.patches.vllm_plugin:register`` and the Ray setup hook
``rlhf_ext.patches.plugin.ray_worker_setup`` -- which forward here for one release.

The public API (``activate``, ``register_plugin``, ...) is :mod:`rlhf_ext.patches`; this package
imports nothing itself, so a host reaching for the Ray carriage loads only that module.
"""
