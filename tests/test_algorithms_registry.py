"""Registries: registration rules, lookup errors, and third-party entry points from a really
installed package."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from rlhf_ext.algorithms import (
    UnknownNameError,
    available_advantages,
    get_advantage,
    get_policy_loss,
    register_advantage,
    register_policy_loss,
)
from rlhf_ext.algorithms.registry import ADVANTAGES, Registry


def test_unknown_name_lists_registered_names_and_is_key_and_value_error():
    with pytest.raises(KeyError) as err:
        get_advantage("grpo_typo")
    msg = str(err.value)
    assert "unknown advantage estimator 'grpo_typo'" in msg
    for name in ("grpo", "passk", "maxrl", "rloo"):
        assert name in msg
    assert isinstance(err.value, ValueError) and isinstance(err.value, UnknownNameError)
    with pytest.raises(ValueError, match=r"registered: .*cispo, .*gspo, .*ppo") as err:
        get_policy_loss("vanilla")
    assert "unknown policy loss 'vanilla'" in str(err.value)


def test_taken_name_raises_unless_override():
    reg = Registry("thing")

    @reg.register("a")
    def a(x):
        return 1

    def b(x):
        return 2

    with pytest.raises(ValueError, match="thing 'a' is already registered.*override=True"):
        reg.register("a")(b)
    assert reg.get("a") is a
    reg.register("a", override=True)(b)
    assert reg.get("a") is b
    reg.register("a", override=True)(b)  # same function again is harmless
    with pytest.raises(ValueError, match="non-empty string"):
        reg.register("")
    with pytest.raises(TypeError, match="non-callable"):
        reg.register("c")(42)


def test_builtin_names_are_protected():
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("grpo")(lambda scores: scores)
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("ppo")(lambda *a, **k: None)


def test_user_registration_is_usable_by_name():
    @register_advantage("test_only_negated")
    def negated(scores):
        return -torch.as_tensor(scores, dtype=torch.float32)

    try:
        assert "test_only_negated" in available_advantages()
        assert torch.equal(get_advantage("test_only_negated")([[1.0, 2.0]]), torch.tensor([[-1.0, -2.0]]))
    finally:
        ADVANTAGES.unregister("test_only_negated")


PLUGIN_SETUP = """
from setuptools import setup
setup(
    name="rlhf-ext-demo-plugin",
    version="0.0.1",
    py_modules=["demo_algos", "broken_algos"],
    entry_points={"rlhf_ext.algorithms": [
        "demo = demo_algos",
        "broken = broken_algos",
    ]},
)
"""

PLUGIN_MODULE = """
import torch
from rlhf_ext.algorithms import register_advantage, register_kl_estimator, get_advantage

@register_advantage("demo_centered_x2")
def demo_centered_x2(scores):
    # registering from inside an entry point may itself touch the registry
    return 2 * get_advantage("dr_grpo")(scores)

@register_kl_estimator("demo_abs")
def demo_abs(log_probs, ref_log_probs):
    return (log_probs - ref_log_probs).abs()
"""

CHECK = """
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from rlhf_ext.algorithms import available_advantages, get_advantage, get_kl_estimator
    names = available_advantages()
import torch
adv = get_advantage("demo_centered_x2")(torch.tensor([[1.0, 0.0, 0.0, 1.0]])).tolist()
kl = get_kl_estimator("demo_abs")(torch.tensor([[0.0]]), torch.tensor([[2.0]])).tolist()
try:
    get_advantage("from_broken_plugin")
    missing = ""
except KeyError as e:
    missing = str(e)
print(json.dumps({"names": names, "adv": adv, "kl": kl, "warnings": [str(w.message) for w in caught], "missing": missing}))
"""


def test_third_party_entry_point_package(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "setup.py").write_text(PLUGIN_SETUP)
    (src / "demo_algos.py").write_text(PLUGIN_MODULE)
    (src / "broken_algos.py").write_text("raise ImportError('this plugin is broken on purpose')\n")
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert list(target.glob("rlhf_ext_demo_plugin-*.dist-info"))
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(CHECK)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert "demo_centered_x2" in res["names"] and "grpo" in res["names"]
    assert res["adv"] == [[1.0, -1.0, -1.0, 1.0]]
    assert res["kl"] == [[2.0]]
    assert any("'broken'" in w and "broken on purpose" in w for w in res["warnings"])
    assert "broken (ImportError: this plugin is broken on purpose)" in res["missing"]

    # without the package on the path, the names are not there
    out = subprocess.run([sys.executable, "-c", "from rlhf_ext.algorithms import available_advantages as a; print(a())"],
                         capture_output=True, text=True, timeout=120)
    assert "demo_centered_x2" not in out.stdout and "grpo" in out.stdout
