"""Framework glue: the OpenRLHF plugin (startup hook, argument flags, patched seams).

Framework-free math stays in :mod:`rlhf_ext.algorithms` and :mod:`rlhf_ext.rewards`; only this
package knows OpenRLHF's internals.
"""
