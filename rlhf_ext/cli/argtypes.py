"""Forwarding module: the argument types live in :mod:`rlhf_ext.ground.argtypes` (below every tool that
uses them). Kept so ``from rlhf_ext.cli.argtypes import ...`` keeps working."""

from ..ground.argtypes import port, positive_float, positive_int, positive_seconds, probability

__all__ = ["port", "positive_float", "positive_int", "positive_seconds", "probability"]
