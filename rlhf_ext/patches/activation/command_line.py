"""Which framework's command line this interpreter runs: OpenRLHF's, MindSpeed-RL's, or neither.

Start-up (:mod:`.startup`) honours ``--plugin`` only on these command lines, and
activation (:mod:`.plugin`) calls such a process the run's driver. Both read the
interpreter's own argv; nothing here imports a framework.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms at start-up
if TYPE_CHECKING:
    from typing import List, Optional


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
