"""The start-up hook: installed .pth, --plugin / RLHF_EXT_PLUGINS handling, idempotent activation."""

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import threading
from pathlib import Path

import pytest

from rlhf_ext.patches.activation import command_line, plugin, startup

SHOW = textwrap.dedent(
    """
    import json, os, sys
    from rlhf_ext.patches import active_plugins
    print(json.dumps({"argv": sys.argv[1:], "active": active_plugins(), "env": os.environ.get("RLHF_EXT_PLUGINS"),
                      "torch": "torch" in sys.modules}))
    """
)


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLHF_EXT_")}
    env.update(extra)
    return env


def _run(args, env=None, cwd=None):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env or _env(), cwd=cwd,
                          timeout=120)  # fmt: skip


@pytest.fixture()
def fake_openrlhf_cli(tmp_path):
    """A script whose path looks like an OpenRLHF CLI (``.../openrlhf/cli/show.py``): no torch needed."""
    path = tmp_path / "openrlhf" / "cli" / "show.py"
    path.parent.mkdir(parents=True)
    path.write_text(SHOW)
    return path


def test_hook_files_are_installed_in_this_environment():
    site = Path(sysconfig.get_paths()["purelib"])
    from runpy import run_path

    repo = Path(__file__).resolve().parents[1]
    line = run_path(str(repo / "rlhf_ext/patches/activation/site_hook/install.py"))["PTH_LINE"]
    assert (site / "rlhf_ext_startup.pth").read_text() == line
    assert line.startswith("import ") and line.count("\n") == 1  # site executes single "import" lines
    assert (site / "rlhf_ext_startup.py").read_text() == (repo / "rlhf_ext/patches/activation/site_hook/rlhf_ext_startup.py").read_text()


def test_unrelated_process_imports_no_rlhf_ext_module():
    code = "import sys, json; print(json.dumps(sorted(sys.modules)))"
    out = _run(["-c", code])
    assert out.returncode == 0, out.stderr
    modules = json.loads(out.stdout)
    assert not [m for m in modules if m.startswith("rlhf_ext")]  # not even the hook module
    assert "rlhf_ext" not in out.stderr


def test_openrlhf_cli_flags_are_consumed_before_the_program_runs(fake_openrlhf_cli):
    out = _run([str(fake_openrlhf_cli), "--plugin", "rlhf_ext", "--x", "1", "--plugin=rlhf_ext", "--", "--plugin", "z"])
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["argv"] == ["--x", "1", "--", "--plugin", "z"]
    assert res["active"] == {"rlhf_ext": "driver"}
    assert res["env"] == "rlhf_ext"  # exported for child processes
    assert res["torch"] is False  # activation itself stays light
    assert f"rlhf_ext: activated plugin(s) rlhf_ext (pid=" in out.stderr and "role=driver" in out.stderr
    assert out.stderr.count("activated plugin") == 1


def test_environment_variable_activates_any_python_process():
    out = _run(["-c", SHOW], env=_env(RLHF_EXT_PLUGINS="rlhf_ext"))
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["active"] == {"rlhf_ext": "process"}
    line = [l for l in out.stderr.splitlines() if "activated plugin" in l]
    assert len(line) == 1 and "role=process" in line[0]


def test_other_programs_keep_their_own_plugin_option():
    out = _run(["-c", "import sys, json; print(json.dumps(sys.argv[1:]))", "--plugin", "not_ours"])
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ["--plugin", "not_ours"]


def test_unknown_plugin_exits_with_the_list_of_plugins(fake_openrlhf_cli):
    out = _run([str(fake_openrlhf_cli), "--plugin", "rlhf_extt"])
    assert out.returncode == 2
    assert "unknown plugin 'rlhf_extt'" in out.stderr and "available plugins: rlhf_ext" in out.stderr
    assert out.stdout == ""  # the program never ran
    out = _run(["-c", "print('ran')"], env=_env(RLHF_EXT_PLUGINS="nope"))
    assert out.returncode == 2 and "unknown plugin 'nope'" in out.stderr


def test_plugin_flag_without_name_is_an_error(fake_openrlhf_cli):
    out = _run([str(fake_openrlhf_cli), "--x", "--plugin"])
    assert out.returncode == 2 and "--plugin needs a plugin name" in out.stderr


def test_extract_plugin_flags():
    names, rest = startup.extract_plugin_flags(["--a", "--plugin", "x,y", "--plugin=z", "--b", "2"])
    assert names == ["x,y", "z"] and rest == ["--a", "--b", "2"]
    assert startup.extract_plugin_flags(["--", "--plugin", "x"]) == ([], ["--", "--plugin", "x"])
    with pytest.raises(startup.PluginFlagError):
        startup.extract_plugin_flags(["--plugin", "--other"])
    with pytest.raises(startup.PluginFlagError):
        startup.extract_plugin_flags(["--plugin="])
    assert plugin.parse_names(["a,b", " c ", "a", ""]) == ["a", "b", "c"]


def test_program_detection():
    assert command_line.program_is_openrlhf_cli(["-m", "x"], ["python", "-m", "openrlhf.cli.train_ppo_ray", "x"])
    assert command_line.program_is_openrlhf_cli(["/s/openrlhf/cli/train_sft.py"], ["python", "/s/openrlhf/cli/train_sft.py"])
    assert not command_line.program_is_openrlhf_cli(["-m"], ["python", "-m", "pytest"])
    assert not command_line.program_is_openrlhf_cli(["tool.py"], ["python", "tool.py"])


@pytest.fixture()
def counting_plugin():
    calls = []
    lock = threading.Lock()

    def activate(role):
        with lock:
            calls.append(role)

    plugin.register_plugin("test_counting_plugin", activate)
    saved = os.environ.get(plugin.ENV_VAR)
    try:
        yield calls
    finally:
        plugin._forget_for_tests(["test_counting_plugin"])
        plugin._registry.pop("test_counting_plugin", None)
        if saved is None:
            os.environ.pop(plugin.ENV_VAR, None)
        else:
            os.environ[plugin.ENV_VAR] = saved


def test_activation_is_idempotent_and_thread_safe(counting_plugin, capfd):
    barrier = threading.Barrier(16)

    def worker():
        barrier.wait()
        plugin.activate(["test_counting_plugin"], role="thread")

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    plugin.activate(["test_counting_plugin"])
    assert counting_plugin == ["thread"]
    assert plugin.is_active("test_counting_plugin")
    assert "test_counting_plugin" in os.environ[plugin.ENV_VAR].split(",")
    assert capfd.readouterr().err.count("activated plugin(s) test_counting_plugin") == 1


def test_unknown_name_activates_nothing(counting_plugin):
    with pytest.raises(plugin.UnknownPluginError, match="unknown plugin 'missing_one'"):
        plugin.activate(["test_counting_plugin", "missing_one"])
    assert counting_plugin == [] and not plugin.is_active("test_counting_plugin")


def test_register_plugin_rejects_bad_names():
    with pytest.raises(ValueError):
        plugin.register_plugin("a,b", lambda role: None)
    with pytest.raises(ValueError, match="already registered"):
        plugin.register_plugin("rlhf_ext", lambda role: None)


def test_role_of_a_ray_worker_process():
    code = "import sys; sys.argv[0] = '/x/ray/_private/workers/default_worker.py'; from rlhf_ext.patches import detect_role; print(detect_role())"
    out = _run(["-c", code])
    assert out.stdout.strip() == "ray-worker", out.stderr


def test_regular_install_ships_the_hook(tmp_path):
    """``pip install .`` (a wheel, not editable) puts the module and the .pth at the top of site-packages."""
    import shutil

    repo = Path(__file__).resolve().parents[1]
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(repo / name, src / name)
    shutil.copytree(repo / "rlhf_ext", src / "rlhf_ext", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "site"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    from runpy import run_path

    line = run_path(str(repo / "rlhf_ext/patches/activation/site_hook/install.py"))["PTH_LINE"]
    assert (target / "rlhf_ext_startup.pth").read_text() == line
    assert (target / "rlhf_ext_startup.py").read_text() == (repo / "rlhf_ext/patches/activation/site_hook/rlhf_ext_startup.py").read_text()
    assert "rlhf_ext = rlhf_ext.patches.activation.vllm_plugin:register" in next(target.glob("rlhf_ext-*.dist-info")).joinpath(
        "entry_points.txt"
    ).read_text()
    # Process only that directory's .pth files (-S: no site-packages of this environment).
    code = (f"import site, sys; site.addsitedir({str(target)!r}); "
            "print(sys.modules['rlhf_ext_startup'].__file__, sys.modules['rlhf_ext.patches'].__file__)")  # fmt: skip
    out = _run(["-S", "-c", code], env=_env(RLHF_EXT_PLUGINS="rlhf_ext"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(target / "rlhf_ext_startup.py"), str(target / "rlhf_ext/patches/__init__.py")]
    assert "activated plugin(s) rlhf_ext" in out.stderr


def test_relative_script_path_is_a_driver(fake_openrlhf_cli):
    # `ray job submit -- python openrlhf/cli/x.py ...` runs the entrypoint with a relative path
    root = fake_openrlhf_cli.parents[2]
    out = _run(["openrlhf/cli/show.py", "--plugin", "rlhf_ext"], cwd=root)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["active"] == {"rlhf_ext": "driver"}
