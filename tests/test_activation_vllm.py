"""vLLM's ``vllm.general_plugins`` entry point activates the plugin in vLLM's processes."""

import os
import subprocess
import sys
import textwrap
from importlib import metadata


def test_entry_point_is_declared():
    eps = {ep.name: ep.value for ep in metadata.entry_points(group="vllm.general_plugins")}
    assert eps.get("rlhf_ext") == "rlhf_ext.patches.activation.vllm_plugin:register"


def test_register_is_a_no_op_without_the_variable(monkeypatch):
    from rlhf_ext.patches import is_active
    from rlhf_ext.patches.activation.vllm_plugin import register

    monkeypatch.delenv("RLHF_EXT_PLUGINS", raising=False)
    register()
    assert not is_active("rlhf_ext")


def test_vllm_loads_it_in_a_fresh_process():
    # The variable appears only after start-up, so the .pth hook did nothing and the activation
    # seen below comes from vLLM's own plugin loader (what an engine-core / worker process runs).
    code = textwrap.dedent(
        """
        import os, sys
        from rlhf_ext.patches import active_plugins
        assert active_plugins() == {}
        os.environ["RLHF_EXT_PLUGINS"] = "rlhf_ext"
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        print(active_plugins())
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLHF_EXT_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "{'rlhf_ext': 'vllm'}"
    assert "role=vllm" in out.stderr
