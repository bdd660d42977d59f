"""Interpreter start-up: turn ``--plugin NAME`` and ``RLHF_EXT_PLUGINS`` into an activation.

Called from the installed ``rlhf_ext_startup`` module (itself imported by ``rlhf_ext_startup.pth``
in site-packages) only when the command line mentions ``--plugin`` or the variable is set, so
unrelated Python processes never import this module.

``--plugin`` is honoured only on OpenRLHF command lines (``python -m openrlhf.cli.*`` or a script
under ``openrlhf/cli/``) and MindSpeed-RL's (``python cli/train_{grpo,dapo,ppo}.py`` of a
MindSpeed-RL checkout, whose Hydra parser would reject the flag; :mod:`.command_line`
tells them apart): other programs may have a ``--plugin`` option of their own, and their
arguments are left alone. The flags are removed from ``sys.argv`` in place before the program's
own parser runs, so OpenRLHF's strict parser never sees them.
"""

from __future__ import annotations

import os
import sys

from .command_line import host_cli

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms at start-up
if TYPE_CHECKING:
    from typing import List, Tuple

FLAG = "--plugin"


class PluginFlagError(ValueError):
    pass


def extract_plugin_flags(argv: List[str]) -> Tuple[List[str], List[str]]:
    """Split ``argv`` into (plugin names, remaining arguments).

    Accepts ``--plugin NAME``, ``--plugin=NAME`` and comma lists, repeatable. Stops at ``--``
    (arguments after it belong to the program). A ``--plugin`` without a name is an error.
    """
    names: List[str] = []
    rest: List[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest.extend(argv[i:])
            break
        if arg == FLAG:
            if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
                raise PluginFlagError("--plugin needs a plugin name, e.g. --plugin rlhf_ext")
            names.append(argv[i + 1])
            i += 2
            continue
        if arg.startswith(FLAG + "="):
            value = arg[len(FLAG) + 1 :]
            if not value:
                raise PluginFlagError("--plugin= needs a plugin name, e.g. --plugin=rlhf_ext")
            names.append(value)
            i += 1
            continue
        rest.append(arg)
        i += 1
    return names, rest


def _fail(message: str) -> None:
    # SystemExit raised while site-packages are processed aborts the interpreter with a
    # "Fatal Python error" traceback; print the message and leave directly instead.
    sys.stderr.write(f"rlhf_ext: error: {message}\n")
    sys.stderr.flush()
    os._exit(2)


def run() -> None:
    """Entry point of the start-up hook."""
    from . import plugin

    names: List[str] = []
    if host_cli() is not None:
        try:
            flag_names, rest = extract_plugin_flags(sys.argv[1:])
        except PluginFlagError as exc:
            _fail(str(exc))
            return
        if flag_names:
            sys.argv[1:] = rest
            names = plugin.parse_names(flag_names)
    names = plugin.parse_names(plugin.requested_from_env() + names)
    if not names:
        return
    from ...npu import BackendUnavailableError
    from ..mindspeed_rl.compat import MindSpeedRLCompatibilityError
    from ..openrlhf.compat import OpenRLHFCompatibilityError
    from ..retarget import RetargetError

    try:
        plugin.activate(names)
    except (plugin.UnknownPluginError, OpenRLHFCompatibilityError, MindSpeedRLCompatibilityError,
            BackendUnavailableError, RetargetError) as exc:
        _fail(str(exc))
