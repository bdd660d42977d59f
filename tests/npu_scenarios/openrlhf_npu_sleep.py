"""Scenario: ``--vllm.enable_sleep`` on the NPU target, through OpenRLHF's real parser with the plugin's hook.

Run by tests/test_sleep_mode.py with tests/npu_standin on PYTHONPATH and no RLHF_EXT_DEVICE (the
backend is detected). The driver is set up as a real one is (the plugin activated, which applies the
retarget; torch imported, which applies the NPU shim and rlhf_ext's HCCL/torch_npu defaults), then
OpenRLHF's ``train_ppo_ray`` module body runs on each command line and stops right after parsing.
"""

import io
import os
import runpy
import sys
from contextlib import redirect_stderr

from _scenario import Results

results = Results()

from rlhf_ext.patches import activate  # noqa: E402

activate(["rlhf_ext"], role="test")
from rlhf_ext.patches.openrlhf.cli import install_argparse_hook  # noqa: E402

install_argparse_hook()
from rlhf_ext.patches.retarget import applied_backend  # noqa: E402

import torch  # noqa: E402,F401  (the NPU shim and its environment defaults apply here)

ALLOC = "PYTORCH_NPU_ALLOC_CONF"
SLEEP = ["--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep"]
results["backend"] = applied_backend()
results["alloc_at_start"] = os.environ.get(ALLOC)


class Parsed(Exception):
    pass


def parse(*argv, env=None):
    """``train_ppo_ray``'s parse on ``argv`` with ``env`` added; the parsed flags, the exported variables,
    stderr; the environment is restored afterwards."""
    import openrlhf.utils.config as config

    saved, real = dict(os.environ), config.hierarchize
    os.environ.update(env or {})
    seen = {}

    def spy(args):
        seen["args"] = args
        seen["env"] = {k: os.environ.get(k) for k in (ALLOC, "RLHF_EXT_NPU_SLEEP_MODE")}
        from rlhf_ext.npu.hccl_env import hccl_env_defaults

        seen["worker_default"] = hccl_env_defaults().get(ALLOC)  # what a fresh Ray worker would set
        raise Parsed()

    config.hierarchize = spy
    sys.argv = ["train_ppo_ray.py", *argv]
    err = io.StringIO()
    try:
        with redirect_stderr(err):
            runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__")
    except Parsed:
        args = seen["args"]
        return {"vllm_sleep": getattr(args, "vllm.enable_sleep"), "ds_sleep": getattr(args, "ds.enable_sleep"),
                "env": seen["env"], "worker_default": seen["worker_default"],
                "lines": [line for line in err.getvalue().splitlines() if "enable_sleep" in line]}
    except SystemExit as exc:
        return {"exit": exc.code, "stderr_tail": err.getvalue().strip().splitlines()[-1:]}
    finally:
        config.hierarchize = real
        os.environ.clear()
        os.environ.update(saved)
    return {"error": "did not reach argument parsing"}


if not os.environ.get("SCENARIO_USER_ALLOC"):  # the user exported PYTORCH_NPU_ALLOC_CONF themselves
    results.check("rlhf_ext_default", lambda: parse(*SLEEP))
    results.check("user_other_options", lambda: parse(*SLEEP, env={ALLOC: "max_split_size_mb:256"}))
    results.check("user_expandable_with_more", lambda: parse(
        *SLEEP, env={ALLOC: "page_size:1g,expandable_segments:True"}))
    results.check("no_colocate", lambda: parse("--vllm.enable_sleep"))
    results.check("ds_only", lambda: parse("--train.colocate_all", "--ds.enable_sleep"))
    results.check("no_sleep", lambda: parse("--train.colocate_all"))
else:
    results.check("user_expandable", lambda: parse(*SLEEP))
results.emit()
