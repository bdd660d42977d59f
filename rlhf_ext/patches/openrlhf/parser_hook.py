"""The one path of the argparse hook through an OpenRLHF parser the plugin extends (PPO: :mod:`.cli`,
DPO: :mod:`.dpo_cli`): add the plugin's flags (an incompatible OpenRLHF exits with status 2), parse,
then validate (a bad value is the parser's usage error, naming the flag)."""

from __future__ import annotations

from typing import Any, Callable, Tuple

from . import compat


def extended_parse(parser, original: Callable, args, namespace, *, extend: Callable[[Any], None],
                   finalize: Callable[[Any], Any]) -> Tuple[Any, list, Any]:
    """``(parsed, extras, finalize(parsed))`` for ``parser`` with the plugin's flags added by ``extend``;
    ``original`` is argparse's own ``parse_known_args``."""
    try:
        extend(parser)
    except compat.OpenRLHFCompatibilityError as exc:
        parser.exit(2, f"rlhf_ext: error: {exc}\n")
    parsed, extras = original(parser, args, namespace)
    try:
        finalized = finalize(parsed)
    except ValueError as exc:
        parser.error(str(exc))
    return parsed, extras, finalized
