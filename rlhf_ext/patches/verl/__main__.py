"""``python -m rlhf_ext.patches.verl``: check the installed verl against the glue and list what it registers.

Example::

    $ python -m rlhf_ext.patches.verl
    verl 0.9.1: plugin loaded through the verl.plugins entry point
    advantage estimators: rlhf_ext_dr_grpo, rlhf_ext_grpo, rlhf_ext_maxrl, rlhf_ext_passk, ...
    policy losses: rlhf_ext_gspo, rlhf_ext_ppo
    KL clamp: verl default (set RLHF_EXT_VERL_KL_CLIP=LO,HI or none to change it)

Exit status 1 when the plugin was not loaded by ``import verl`` or a seam does not fit.
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlhf_ext.patches.verl",
        description="Check the installed verl against rlhf_ext's glue and list the estimators, losses and KL "
                    "clamp it registers. Exits 1 when the plugin was not loaded or a seam does not fit.",
        epilog="examples:\n  python -m rlhf_ext.patches.verl\n"
               "  RLHF_EXT_VERL_KL_CLIP=-5,5 python -m rlhf_ext.patches.verl   # shows the clamp verl's processes will use",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.parse_args(argv)
    import importlib

    import verl  # noqa: F401  (loads the verl.plugins entry points)

    from . import CORE_ALGOS, KL_CLIP_ENV, check_seams, check_version, is_active, registered, verl_version

    ok = True
    try:
        check_version()
    except Exception as exc:
        print(f"error: {exc}")
        ok = False
    loaded = is_active()
    print(f"verl {verl_version()}: plugin {'loaded through the verl.plugins entry point' if loaded else 'NOT loaded'}")
    if not loaded:
        print("  (is rlhf_ext installed in this environment, and VERL_USE_EXTERNAL_PLUGINS unset or 'auto'?)")
        ok = False
    module = importlib.import_module(CORE_ALGOS)
    problems = check_seams(module, kl=True)
    for problem in problems:
        print(f"error: {problem}")
    done = registered()
    print("advantage estimators:", ", ".join(done["advantages"]) or "(none)")
    print("policy losses:", ", ".join(done["policy_losses"]) or "(none)")
    for message in done["skipped"]:
        print(f"skipped: {message}")
    clip = done["kl_clip"]
    if clip == "verl default":
        print(f"KL clamp: verl default (set {KL_CLIP_ENV}=LO,HI or none to change it)")
    else:
        print(f"KL clamp: {clip if clip is not None else 'none'} ({KL_CLIP_ENV})")
    return 0 if ok and not problems and done["advantages"] else 1


if __name__ == "__main__":
    sys.exit(main())
