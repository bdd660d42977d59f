"""An install made before activation moved to ``rlhf_ext.patches.activation`` still activates.

Three paths cross installs or processes and so outlive a move: the start-up hook an older install
wrote into site-packages (``rlhf_ext_startup.py`` running ``rlhf_ext.patches.startup``), the vLLM
entry point its metadata declares (``rlhf_ext.patches.vllm_plugin:register``) and the Ray
``worker_process_setup_hook`` string a job started by an older driver carries
(``rlhf_ext.patches.plugin.ray_worker_setup``). Each is loaded here the way its consumer loads it:
Python's ``site`` processing the .pth, importlib.metadata's entry-point loader, Ray's own setup-hook
loader.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# What the previous release installed at the top of site-packages (its rlhf_ext/patches/_startup/).
OLD_PTH_LINE = (
    'import os, sys; (os.environ.get("RLHF_EXT_PLUGINS") or "--plugin" in str(sys.argv)) '
    'and __import__("rlhf_ext_startup")\n'
)
OLD_HOOK_MODULE = '''\
import os
import sys


def _requested():
    if os.environ.get("RLHF_EXT_PLUGINS"):
        return True
    for arg in sys.argv:
        if arg == "--plugin" or arg.startswith("--plugin="):
            return True
    return False


if _requested():
    from rlhf_ext.patches.startup import run

    run()
'''
OLD_VLLM_ENTRY_POINT = "rlhf_ext.patches.vllm_plugin:register"
OLD_RAY_SETUP_HOOK = "rlhf_ext.patches.plugin.ray_worker_setup"


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLHF_EXT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(extra)
    return env


def _run(code, env, *flags):
    out = subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_an_old_start_up_hook_still_activates(tmp_path):
    site_dir = tmp_path / "old_site"
    site_dir.mkdir()
    (site_dir / "rlhf_ext_startup.pth").write_text(OLD_PTH_LINE)
    (site_dir / "rlhf_ext_startup.py").write_text(OLD_HOOK_MODULE)
    # -S: only that directory's .pth files run (not this environment's own, newer hook).
    code = (f"import site, sys, json; site.addsitedir({str(site_dir)!r}); "
            "from rlhf_ext.patches import active_plugins; "
            "print(json.dumps({'active': active_plugins(), 'hook': sys.modules['rlhf_ext_startup'].__file__, "
            "'forwarded': 'rlhf_ext.patches.startup' in sys.modules}))")  # fmt: skip
    out = _run(code, _env(RLHF_EXT_PLUGINS="rlhf_ext"), "-S")
    res = json.loads(out.stdout)
    assert res == {"active": {"rlhf_ext": "process"}, "hook": str(site_dir / "rlhf_ext_startup.py"), "forwarded": True}
    assert out.stderr.count("activated plugin(s) rlhf_ext") == 1


def test_an_old_vllm_entry_point_still_activates():
    code = (
        "import os, json\n"
        "from importlib.metadata import EntryPoint\n"
        "from rlhf_ext.patches import active_plugins\n"
        "assert active_plugins() == {}\n"
        "os.environ['RLHF_EXT_PLUGINS'] = 'rlhf_ext'\n"  # set after start-up: only the entry point can activate
        f"EntryPoint(name='rlhf_ext', value={OLD_VLLM_ENTRY_POINT!r}, group='vllm.general_plugins').load()()\n"
        "print(json.dumps(active_plugins()))\n"
    )
    out = _run(code, _env())
    assert json.loads(out.stdout) == {"rlhf_ext": "vllm"}


def test_an_old_ray_setup_hook_string_still_activates():
    code = (
        "import os, json\n"
        "from ray._private.runtime_env.setup_hook import load_and_execute_setup_hook\n"
        "from rlhf_ext.patches import active_plugins\n"
        "assert active_plugins() == {}\n"
        "os.environ['RLHF_EXT_PLUGINS'] = 'rlhf_ext'\n"
        f"error = load_and_execute_setup_hook({OLD_RAY_SETUP_HOOK!r})\n"
        "print(json.dumps({'error': error, 'active': active_plugins()}))\n"
    )
    out = _run(code, _env())
    assert json.loads(out.stdout) == {"error": None, "active": {"rlhf_ext": "ray-worker"}}


def test_the_old_paths_are_the_new_functions():
    from rlhf_ext.patches import plugin, startup, vllm_plugin
    from rlhf_ext.patches.activation import plugin as new_plugin
    from rlhf_ext.patches.activation import startup as new_startup
    from rlhf_ext.patches.activation import vllm_plugin as new_vllm_plugin
    from rlhf_ext.patches.activation.ray_env import SETUP_HOOK

    assert startup.run is new_startup.run
    assert vllm_plugin.register is new_vllm_plugin.register
    assert plugin.ray_worker_setup is new_plugin.ray_worker_setup
    assert SETUP_HOOK == "rlhf_ext.patches.activation.plugin.ray_worker_setup" != OLD_RAY_SETUP_HOOK
    # the hook the current release installs names the new module, not the forwarding one
    source = (REPO / "rlhf_ext/patches/activation/site_hook/rlhf_ext_startup.py").read_text()
    assert "from rlhf_ext.patches.activation.startup import run" in source and "patches.startup" not in source
