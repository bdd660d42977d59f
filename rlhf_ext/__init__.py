"""rlhf_ext: algorithms, rewards, evaluation and hardware portability for RL fine-tuning frameworks.

A map of the package. The subpackages are the product:

* :mod:`rlhf_ext.algorithms` -- framework-free RL math (advantages, policy losses, KL, DAPO helpers),
  selectable by name through registries.
* :mod:`rlhf_ext.rewards` -- rule rewards and a safe, fast math grader (framework-free too).
* :mod:`rlhf_ext.npu` -- device detection and the ``transfer_to_npu`` / CPU shims.
* :mod:`rlhf_ext.seams` -- the seam mechanism every host's glue and the device shims share: the
  post-import hooks every patch waits on, the replacement ledger, the patch table, a host's release rule.
* :mod:`rlhf_ext.patches` -- glue that plugs the above into OpenRLHF, MindSpeed-RL and verl (one
  subpackage per host) and retargets OpenRLHF to NPUs or the CPU.
* :mod:`rlhf_ext.evalkit` -- benchmark evaluation on vLLM.
* :mod:`rlhf_ext.data`, :mod:`rlhf_ext.queue`, :mod:`rlhf_ext.report` -- data tools between stages,
  suites of runs one at a time, the offline comparison page.
* :mod:`rlhf_ext.alignment` -- ``rlhf-ext alignment``: do vLLM and the training forward agree?

Shared by several of those:

* :mod:`rlhf_ext.runs` -- the run record (``rlhf_ext.run/1``): its files, reading, a run's status,
  ``runs check``, throughput and MFU, the ``rlhf-ext runs`` command; written by the hosts' glue,
  read by the report, the queue, evalkit and the CLI.
* :mod:`rlhf_ext.ground` -- the ground floor, importing nothing of rlhf_ext: the name-registry
  mechanism (``registry``), atomic JSON writes, the strict JSONL reader and the torn-line-safe
  append (``jsonfiles``), argument types (``argtypes``), watching a training command (``supervision``).

Entrances: :mod:`rlhf_ext.cli` is the ``rlhf-ext`` command (one subcommand per tool), and
:mod:`rlhf_ext.tours` holds the runnable tours (``python -m rlhf_ext.tours.smoke``, ``.demo``,
``.quickstart``) and the tiny task they share. Layering: ``algorithms`` and ``rewards`` import no
framework glue, ``npu`` never imports ``patches``, nothing but the CLI imports the tours
(tests/test_house_layering.py checks these and that no two modules import each other).

Importing ``rlhf_ext`` itself is cheap: subpackages load only when used.
"""

__version__ = "0.1.0"
