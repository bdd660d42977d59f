"""The ground floor: small utilities every floor above may use, importing nothing of rlhf_ext.

* :mod:`~rlhf_ext.ground.registry` -- the name-registry mechanism (with entry points) that
  ``rlhf_ext.algorithms`` and ``rlhf_ext.rewards`` build their registries on.
* :mod:`~rlhf_ext.ground.jsonfiles` -- atomic JSON writes, the strict JSONL reader, the torn-line-safe
  JSONL append and tail repair.
* :mod:`~rlhf_ext.ground.argtypes` -- the argument types the tools and the ``rlhf-ext`` command share.
* :mod:`~rlhf_ext.ground.supervision` -- watching a training command (dead actors, leftover processes).
* :mod:`~rlhf_ext.ground.subcommands` -- a command's subcommand table and dispatch (``rlhf-ext``, ``evalkit``).
"""
