"""rlhf_ext: algorithms, rewards, evaluation and hardware portability for RL fine-tuning frameworks.

A map of the package. The subpackages are the product:

* :mod:`rlhf_ext.algorithms` -- framework-free RL math (advantages, policy losses, KL, DAPO helpers),
  selectable by name through registries.
* :mod:`rlhf_ext.rewards` -- rule rewards and a safe, fast math grader (framework-free too).
* :mod:`rlhf_ext.npu` -- device detection, the ``transfer_to_npu`` / CPU shims and the post-import
  hooks every patch waits on.
* :mod:`rlhf_ext.patches` -- glue that plugs the above into OpenRLHF, MindSpeed-RL and verl (one
  subpackage per host) and retargets OpenRLHF to NPUs or the CPU.
* :mod:`rlhf_ext.evalkit` -- benchmark evaluation on vLLM.
* :mod:`rlhf_ext.data`, :mod:`rlhf_ext.queue`, :mod:`rlhf_ext.report` -- data tools between stages,
  suites of runs one at a time, the offline comparison page.
* :mod:`rlhf_ext.alignment` -- ``rlhf-ext alignment``: do vLLM and the training forward agree?

Modules at the top level are shared by several of those, or are one tool each:

* :mod:`rlhf_ext.registry` -- the name registries (with entry points) of algorithms and rewards.
* :mod:`rlhf_ext.runs` -- the run-record format, written by the OpenRLHF glue, read by report and the CLI.
* :mod:`rlhf_ext.supervision` -- watching a training command (dead actors, leftover processes), for
  the queue and the smoke tour.
* :mod:`rlhf_ext.jsonfiles` -- atomic JSON writes and the strict JSONL reader every tool shares.
* :mod:`rlhf_ext.argtypes` -- the argument types the tools and the ``rlhf-ext`` command share.

Entrances: :mod:`rlhf_ext.cli` is the ``rlhf-ext`` command (one subcommand per tool), and
:mod:`rlhf_ext.tours` holds the runnable tours (``python -m rlhf_ext.tours.smoke``, ``.demo``,
``.quickstart``) and the tiny task they share. Layering: ``algorithms`` and ``rewards`` import no
framework glue, ``npu`` never imports ``patches``, nothing but the CLI imports the tours
(tests/test_house_layering.py checks these and that no two modules import each other).

Importing ``rlhf_ext`` itself is cheap: subpackages load only when used.
"""

__version__ = "0.1.0"
