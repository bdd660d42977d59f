"""scripts/lib/installer.sh: the setup scripts install with uv reading pip's configuration, or with pip.

uv does not read pip.conf or ``PIP_*``; on machines of this project's kind those name the local wheel
folders, file:// indexes and the constraints file every install must see."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LIB = REPO / "scripts" / "lib"
VENV = Path(sys.prefix)


def load_translator():
    spec = importlib.util.spec_from_file_location("uv_args_from_pip", LIB / "uv_args_from_pip.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pip_options_become_uv_options_in_order():
    uv_args = load_translator().uv_args
    config = {"index-url": "https://mirror/simple", "extra-index-url": "file:///a/simple file:///b/simple",
              "find-links": "/wheels", "constraint": "/etc/c1.txt /etc/c2.txt", "cert": "/ca.pem", "timeout": "60",
              "trusted-host": "mirror"}
    assert uv_args(config) == [
        "--index-strategy", "unsafe-best-match",
        "--index-url", "https://mirror/simple",
        "--extra-index-url", "file:///a/simple", "--extra-index-url", "file:///b/simple",
        "--find-links", "/wheels",
        "--constraint", "/etc/c1.txt", "--constraint", "/etc/c2.txt",
        "--allow-insecure-host", "mirror",
    ]  # fmt: skip
    assert uv_args({}) == ["--index-strategy", "unsafe-best-match"]
    assert uv_args({"no-index": "true"})[-1] == "--no-index"
    assert "--no-index" not in uv_args({"no-index": "false"})


def clean_pip_env(tmp_path, conf_text):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "RLHF_EXT_", "UV_"))}
    conf = tmp_path / "pip.conf"
    conf.write_text(conf_text)
    env["PIP_CONFIG_FILE"] = str(conf)  # pip's last file: it beats the machine's own pip.conf files
    return env


def test_the_translator_reads_pips_effective_configuration(tmp_path):
    """Files and environment, with pip's precedence: [install] beats [global], ``PIP_*`` beats both; the
    sections of other pip commands ([download]) are not pip install's."""
    env = clean_pip_env(tmp_path, "[global]\nextra-index-url = file:///a/simple file:///b/simple\n"
                                  "find-links = /global-wheels\nconstraint = /from-file.txt\n"
                                  "[install]\nfind-links = /install-wheels\n"
                                  "[download]\ntrusted-host = only-for-pip-download\n")  # fmt: skip
    env.update(PIP_INDEX_URL="https://mirror.example/simple", PIP_CONSTRAINT="/from-env.txt", PIP_CERT="/ca.pem")
    out = subprocess.run([sys.executable, str(LIB / "uv_args_from_pip.py")], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout.split("\n")  # fmt: skip
    cert = subprocess.run([sys.executable, str(LIB / "uv_args_from_pip.py"), "--cert"], env=env, capture_output=True,
                          text=True, timeout=60, check=True).stdout  # fmt: skip
    assert cert == "/ca.pem\n"
    assert [line for line in out if line] == [
        "--index-strategy", "unsafe-best-match",
        "--index-url", "https://mirror.example/simple",
        "--extra-index-url", "file:///a/simple", "--extra-index-url", "file:///b/simple",
        "--find-links", "/install-wheels",
        "--constraint", "/from-env.txt",
    ]  # fmt: skip


def bash_with_installer(script, env):
    return subprocess.run(["bash", "-c", f'set -euo pipefail; . scripts/lib/installer.sh; {script}'], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip


def tiny_distribution(tmp_path, package):
    """A one-module setuptools project in ``tmp_path/src`` whose package ``package`` holds ``VALUE = 7``."""
    src = tmp_path / "src"
    (src / package).mkdir(parents=True)
    (src / package / "__init__.py").write_text("VALUE = 7\n")
    (src / "setup.py").write_text(f"from setuptools import setup\nsetup(name='{package.replace('_', '-')}', "
                                  f"version='1.0', packages=['{package}'])\n")  # fmt: skip
    return src


def test_an_unknown_installer_or_mode_is_refused_by_name():
    env = {**os.environ, "RLHF_EXT_INSTALLER": "conda"}
    proc = bash_with_installer(f'installer_init "{VENV}"', env)
    assert proc.returncode == 2
    assert "RLHF_EXT_INSTALLER=conda: expected uv or pip" in proc.stderr
    proc = bash_with_installer(f'installer_init "{VENV}" fast', {**os.environ, "RLHF_EXT_INSTALLER": "pip"})
    assert proc.returncode == 2
    assert "expected compile or no-compile, got 'fast'" in proc.stderr


@pytest.mark.parametrize("installer", ["uv", "pip"])
@pytest.mark.parametrize("mode", ["compile", "no-compile"])
def test_each_installer_really_installs_with_the_machines_indexes(installer, mode, tmp_path):
    """A local distribution installed with ``pkg_install`` lands, byte-compiled or not as asked, and the
    tool used is the one asked for: uv with the options read from pip's configuration, or pip itself."""
    src = tiny_distribution(tmp_path, "tinydist_for_installer")
    target = tmp_path / "target"
    env = {**os.environ, "RLHF_EXT_INSTALLER": installer}
    env.pop("RLHF_EXT_UV", None)
    proc = bash_with_installer(
        f'installer_init "{VENV}" {mode}; echo "uv=$INSTALLER_UV"; echo "args=${{INSTALLER_UV_ARGS[*]:-}}"; '
        f'pkg_install --no-deps --no-build-isolation --target "{target}" "{src}"', env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split("=", 1) for line in proc.stdout.splitlines() if line.startswith(("uv=", "args=")))
    if installer == "uv":
        assert lines["uv"] == f"{VENV}/bin/uv"
        assert lines["args"].startswith("--index-strategy unsafe-best-match")
    else:
        assert lines["uv"] == "" and lines["args"] == ""
    package = target / "tinydist_for_installer"
    assert (package / "__init__.py").read_text() == "VALUE = 7\n"
    compiled = list(package.glob("__pycache__/__init__.*.pyc"))
    assert bool(compiled) == (mode == "compile"), compiled


def test_an_unreadable_pip_configuration_leaves_uv_unused(tmp_path):
    """Without pip's indexes and constraints uv would install other builds: pip itself must then install."""
    env = clean_pip_env(tmp_path, "[global\nfind-links = /wheels\n")  # no section header: pip cannot load it
    env["RLHF_EXT_INSTALLER"] = "uv"
    proc = bash_with_installer(f'installer_init "{VENV}"; echo "uv=$INSTALLER_UV"', env)
    assert proc.returncode == 0, proc.stderr
    assert "uv=\n" in proc.stdout
    assert "could not read pip's configuration for uv; installing with pip instead" in proc.stderr


def test_where_uv_fails_the_install_is_done_with_pip_and_says_so(tmp_path):
    """A uv that cannot install (here a stand-in that exits 2, as uv does on an index it cannot reach
    through a proxy it was not told of): pip, which reads its configuration itself, installs instead."""
    failing_uv = tmp_path / "uv"
    failing_uv.write_text("#!/bin/sh\necho 'error: Failed to fetch' >&2\nexit 2\n")
    failing_uv.chmod(0o755)
    src = tiny_distribution(tmp_path, "tinydist_fallback")
    target = tmp_path / "target"
    env = {**os.environ, "RLHF_EXT_INSTALLER": "uv", "RLHF_EXT_UV": str(failing_uv)}
    proc = bash_with_installer(f'installer_init "{VENV}"; echo "uv=$INSTALLER_UV"; '
                               f'pkg_install --no-deps --no-build-isolation --target "{target}" "{src}"', env)
    assert proc.returncode == 0, proc.stderr
    assert f"uv={failing_uv}" in proc.stdout
    assert "setup: uv failed (exit 2) installing --no-deps" in proc.stderr
    assert "installing it with pip instead" in proc.stderr
    assert (target / "tinydist_fallback" / "__init__.py").exists()
