"""Run a scenario script of this directory in a fresh interpreter and return its results dict.

Loaded by tests/test_npu_*.py and tests/test_retarget_*.py through importlib (tests/ is not a package).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
STANDIN = HERE.parent / "npu_standin"
RESULT_MARK = "RLHF_EXT_SCENARIO_RESULT "


def scenario_env(standin, extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLHF_EXT_", "STANDIN_"))}
    paths = [str(STANDIN)] if standin else []
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    if standin:
        # CANN's set_env.sh exports this; DeepSpeed's NPU accelerator reads it when building its op table.
        env.setdefault("ASCEND_HOME_PATH", str(STANDIN))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.update(extra or {})
    return env


def run_scenario(script, *args, standin=False, env=None, timeout=300):
    """Results of ``npu_scenarios/<script>``; raises with the script's output when it printed none."""
    proc = subprocess.run(
        [sys.executable, str(HERE / script), *args],
        env=scenario_env(standin, env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    for line in reversed(proc.stdout.splitlines()):
        if RESULT_MARK in line:
            return json.loads(line.split(RESULT_MARK, 1)[1])
    raise AssertionError(
        f"scenario {script} printed no result (exit {proc.returncode})\n--- stdout\n{proc.stdout[-4000:]}\n"
        f"--- stderr\n{proc.stderr[-6000:]}"
    )
