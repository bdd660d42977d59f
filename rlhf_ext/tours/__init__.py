"""Entrances to rlhf_ext: runnable tours and the tiny task they share, each ``python -m rlhf_ext.tours.<name>``.

* :mod:`~rlhf_ext.tours.smoke` -- the whole story on a CPU: tiny task -> evaluate -> RL with
  OpenRLHF + ``--plugin rlhf_ext`` -> evaluate again (also ``rlhf-ext smoke``; docs/smoke.md).
* :mod:`~rlhf_ext.tours.distill` -- the smoke tour with a teacher: the tiny model trained longer
  distils into the tiny model through OpenRLHF + ``--rlhf_ext.teacher`` (docs/smoke.md).
* :mod:`~rlhf_ext.tours.tiny_task` -- the built-in "What is A + B?" task and a tiny Qwen2 warmed up
  on it, built locally from a seed (also ``rlhf-ext tiny-task``).
* :mod:`~rlhf_ext.tours.quickstart` -- the evalkit path on a random tiny model in two minutes.
* :mod:`~rlhf_ext.tours.demo` -- every advantage estimator, policy loss and KL estimator of
  :mod:`rlhf_ext.algorithms` on one toy batch.

Nothing in the product subpackages imports these; they use the product as a user would.
"""
