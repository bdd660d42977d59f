"""Interpreter start-up: turn ``--plugin NAME`` and ``RLHF_EXT_PLUGINS`` into an activation.

Called from the installed ``rlhf_ext_startup`` module (itself imported by ``rlhf_ext_startup.pth``
in site-packages) only when the command line mentions ``--plugin`` or the variable is set, so
unrelated Python processes never import this module.

``--plugin`` is honoured only on OpenRLHF command lines (``python -m openrlhf.cli.*`` or a script
under ``openrlhf/cli/``) and MindSpeed-RL's (``python cli/train_{grpo,dapo,ppo}.py`` of a
MindSpeed-RL checkout, whose Hydra parser would reject the flag): other programs may have a ``--plugin`` option of their own, and their
arguments are left alone. The flags are removed from ``sys.argv`` in place before the program's
own parser runs, so OpenRLHF's strict parser never sees them.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms at start-up
if TYPE_CHECKING:
    from typing import List, Optional, Tuple

FLAG = "--plugin"


class PluginFlagError(ValueError):
    pass


def program_is_openrlhf_cli(argv: Optional[List[str]] = None, orig_argv: Optional[List[str]] = None) -> bool:
    """Whether this interpreter runs an OpenRLHF CLI (``-m openrlhf.cli.X`` or ``.../openrlhf/cli/X.py``)."""
    argv = sys.argv if argv is None else argv
    orig = list(getattr(sys, "orig_argv", []) if orig_argv is None else orig_argv)
    if "-m" in orig:
        i = orig.index("-m")
        if i + 1 < len(orig) and orig[i + 1].startswith("openrlhf.cli."):
            return True
    first = argv[0] if argv else ""
    return first.endswith(".py") and "openrlhf/cli/" in first.replace(os.sep, "/")


MINDSPEED_RL_SCRIPTS = ("train_grpo.py", "train_dapo.py", "train_ppo.py")


def program_is_mindspeed_rl_cli(argv: Optional[List[str]] = None) -> bool:
    """Whether this interpreter runs MindSpeed-RL's ``cli/train_{grpo,dapo,ppo}.py`` (a checkout's script)."""
    argv = sys.argv if argv is None else argv
    first = argv[0] if argv else ""
    if os.path.basename(first) not in MINDSPEED_RL_SCRIPTS:
        return False
    cli_dir = os.path.dirname(os.path.abspath(first))
    return os.path.basename(cli_dir) == "cli" and os.path.isdir(os.path.join(os.path.dirname(cli_dir), "mindspeed_rl"))


def host_cli() -> Optional[str]:
    """``"openrlhf"``, ``"mindspeed_rl"`` or None: the framework whose command line this process runs."""
    if program_is_openrlhf_cli():
        return "openrlhf"
    if program_is_mindspeed_rl_cli():
        return "mindspeed_rl"
    return None


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
    from ..npu import BackendUnavailableError
    from .mindspeed_rl.compat import MindSpeedRLCompatibilityError
    from .openrlhf.compat import OpenRLHFCompatibilityError
    from .retarget import RetargetError

    try:
        plugin.activate(names)
    except (plugin.UnknownPluginError, OpenRLHFCompatibilityError, MindSpeedRLCompatibilityError,
            BackendUnavailableError, RetargetError) as exc:
        _fail(str(exc))
