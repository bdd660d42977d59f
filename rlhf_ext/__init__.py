"""rlhf_ext: algorithms, rewards, evaluation and hardware portability for RL fine-tuning frameworks.

Subpackages:

* :mod:`rlhf_ext.algorithms` -- framework-free RL math (advantages, policy losses, KL, DAPO helpers),
  selectable by name through registries.
* :mod:`rlhf_ext.rewards` -- rule rewards and a safe, fast math grader.
* :mod:`rlhf_ext.npu` -- device detection and the ``transfer_to_npu`` shim.
* :mod:`rlhf_ext.patches` -- glue that plugs the above into OpenRLHF (and later MindSpeed-RL).
* :mod:`rlhf_ext.evalkit` -- benchmark evaluation on vLLM.

Importing ``rlhf_ext`` itself is cheap: subpackages load only when used.
"""

__version__ = "0.1.0"
