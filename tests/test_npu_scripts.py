"""scripts/npu and scripts/gpu: --help, input validation that fails early, and the commands they build
(run with --dry-run, which prints the environment and the command instead of starting Ray)."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = [
    "npu/start_ray_cluster.sh",
    "npu/submit_ppo.sh",
    "npu/submit_evalkit.sh",
    "gpu/start_ray_cluster.sh",
    "gpu/submit_ppo.sh",
    "gpu/submit_evalkit.sh",
]


def run(script, *args, env=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("HCCL_", "RLHF_EXT_", "ASCEND_", "RAY_"))}
    # `ray` lives next to this interpreter (the project's venv).
    full_env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), full_env.get("PATH", "")])
    full_env.update(env or {})
    return subprocess.run(
        ["bash", str(REPO / "scripts" / script), *args], capture_output=True, text=True, env=full_env, timeout=60
    )


@pytest.fixture
def fake_cann(tmp_path):
    """A stand-in for CANN's set_env.sh: exports what the real one exports that the script checks."""
    path = tmp_path / "set_env.sh"
    path.write_text(f'export ASCEND_HOME_PATH="{tmp_path}"\nexport LD_LIBRARY_PATH="$LD_LIBRARY_PATH:{tmp_path}"\n')
    return str(path)


def dry_run_lines(proc):
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    exports = dict(line[len("export ") :].split("=", 1) for line in lines[:-1])
    return exports, shlex.split(lines[-1])


@pytest.mark.parametrize("script", SCRIPTS)
def test_help(script):
    proc = run(script, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Usage:")
    assert "--dry-run" in proc.stdout and "--address" in proc.stdout


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_are_strict_bash(script):
    text = (REPO / "scripts" / script).read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
    assert os.access(REPO / "scripts" / script, os.X_OK)
    assert subprocess.run(["bash", "-n", str(REPO / "scripts" / script)]).returncode == 0


@pytest.mark.parametrize(
    "args, code, message",
    [
        ((), 2, "say 'head' or 'worker'"),
        (("leader",), 2, "must be 'head' or 'worker'"),
        (("worker", "--npus", "8"), 2, "worker needs --address"),
        (("worker", "--address", "10.0.0.1"), 2, "HOST:PORT"),
        (("head", "--address", "10.0.0.1:6379"), 2, "--address is for workers"),
        (("head", "--npus", "0"), 2, "--npus must be a positive integer"),
        (("head", "--port", "70000"), 2, "port number"),
        (("head", "--node-ip", "10.0.0"), 2, "IPv4"),
        (("head", "--ifname", "no_such_if9", "--npus", "2"), 1, "not a network interface of this node"),
        (("head", "--cann-env", "/nonexistent/set_env.sh", "--npus", "2"), 1, "'/nonexistent/set_env.sh' not found"),
        (("head", "--port"), 2, "--port needs a value"),
        (("head", "--bogus"), 2, "unknown option '--bogus'"),
    ],
)
def test_npu_start_rejects_bad_input(args, code, message):
    proc = run("npu/start_ray_cluster.sh", *args)
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    assert message in proc.stderr
    assert proc.stdout == ""  # nothing was started or printed as a command


def test_npu_start_needs_cann_to_set_ascend_home(tmp_path):
    not_cann = tmp_path / "set_env.sh"
    not_cann.write_text("export SOMETHING_ELSE=1\n")
    proc = run("npu/start_ray_cluster.sh", "head", "--npus", "8", "--cann-env", str(not_cann))
    assert proc.returncode == 1
    assert "did not set ASCEND_HOME_PATH" in proc.stderr


def test_npu_count_comes_from_davinci_devices(fake_cann, tmp_path):
    devices = tmp_path / "dev"
    devices.mkdir()
    proc = run("npu/start_ray_cluster.sh", "head", "--cann-env", fake_cann, env={"RLHF_EXT_DEV_DIR": str(devices)})
    assert proc.returncode == 1
    assert f"no {devices}/davinci* devices" in proc.stderr and "--npus" in proc.stderr
    for name in ("davinci0", "davinci1", "davinci2", "davinci_manager", "devmm_svm"):
        (devices / name).touch()
    proc = run("npu/start_ray_cluster.sh", "head", "--cann-env", fake_cann, "--dry-run",
               env={"RLHF_EXT_DEV_DIR": str(devices)})  # fmt: skip
    _, command = dry_run_lines(proc)
    assert json.loads(command[2].split("=", 1)[1]) == {"NPU": 3}


def test_npu_head_command_and_environment(fake_cann):
    proc = run(
        "npu/start_ray_cluster.sh", "head", "--npus", "8", "--cann-env", fake_cann,
        "--ifname", "lo", "--node-ip", "10.0.0.1", "--port", "6380", "--dry-run",
        env={"HCCL_EXEC_TIMEOUT": "99"},
    )  # fmt: skip
    exports, command = dry_run_lines(proc)
    assert command[:2] == ["ray", "start"]
    resources = next(arg for arg in command if arg.startswith("--resources="))
    assert json.loads(resources.split("=", 1)[1]) == {"NPU": 8}
    assert {"--head", "--port=6380", "--node-ip-address=10.0.0.1"} <= set(command)
    assert exports["RLHF_EXT_DEVICE"] == "npu"
    assert exports["HCCL_SOCKET_IFNAME"] == exports["GLOO_SOCKET_IFNAME"] == exports["TP_SOCKET_IFNAME"] == "lo"
    assert exports["HCCL_IF_IP"] == "10.0.0.1"
    assert exports["HCCL_CONNECT_TIMEOUT"] == "1800"
    assert exports["HCCL_EXEC_TIMEOUT"] == "99"  # the caller's value wins over the default


def test_npu_worker_command(fake_cann):
    proc = run(
        "npu/start_ray_cluster.sh", "worker", "--address", "10.0.0.1:6379", "--npus", "16",
        "--cann-env", fake_cann, "--dry-run",
    )  # fmt: skip
    _, command = dry_run_lines(proc)
    assert "--address=10.0.0.1:6379" in command and "--head" not in command
    assert json.loads(command[2].split("=", 1)[1]) == {"NPU": 16}


def _runtime_env(command):
    arg = next(a for a in command if a.startswith("--runtime-env-json="))
    return json.loads(arg.split("=", 1)[1])


def test_submit_ppo_builds_the_plugin_job(tmp_path):
    proc = run(
        "npu/submit_ppo.sh", "--address", "http://10.0.0.1:8265", "--env", "WANDB_MODE=offline",
        "--working-dir", str(tmp_path), "--dry-run", "--", "--actor.num_gpus_per_node", "8", "--train.colocate_all",
        env={"HCCL_SOCKET_IFNAME": "eth1", "UNRELATED_VAR": "x"},
    )  # fmt: skip
    _, command = dry_run_lines(proc)
    assert command[:3] == ["ray", "job", "submit"]
    assert "--address=http://10.0.0.1:8265" in command
    entry = command[command.index("--") + 1 :]
    assert entry == [
        "python3", "-m", "openrlhf.cli.train_ppo_ray", "--plugin", "rlhf_ext",
        "--actor.num_gpus_per_node", "8", "--train.colocate_all",
    ]  # fmt: skip
    runtime_env = _runtime_env(command)
    assert runtime_env["env_vars"] == {"RLHF_EXT_DEVICE": "npu", "HCCL_SOCKET_IFNAME": "eth1", "WANDB_MODE": "offline"}
    assert runtime_env["working_dir"] == str(tmp_path)


def test_submit_evalkit_passes_dp():
    proc = run("npu/submit_evalkit.sh", "--dp", "4", "--dry-run", "--", "math500", "--model", "/m")
    _, command = dry_run_lines(proc)
    entry = command[command.index("--") + 1 :]
    # evalkit takes its first word as the task, so --dp follows it (before it, evalkit refused every job)
    assert entry == ["python3", "-m", "rlhf_ext.evalkit", "math500", "--dp", "4", "--model", "/m"]
    assert _runtime_env(command)["env_vars"] == {"RLHF_EXT_DEVICE": "npu"}
    from rlhf_ext.evalkit.cli import build_parser

    args = build_parser("math500").parse_args(entry[3:])
    assert args.dp == 4 and args.model == "/m"
    no_task = run("npu/submit_evalkit.sh", "--dp", "4", "--dry-run", "--", "--model", "/m")
    assert no_task.returncode == 2 and "name the evalkit task after --" in no_task.stderr


@pytest.mark.parametrize(
    "script, args, message",
    [
        ("npu/submit_ppo.sh", ("--dry-run",), "no arguments for the job after --"),
        ("npu/submit_ppo.sh", ("--address", "10.0.0.1:8265", "--", "x"), "Ray dashboard URL"),
        ("npu/submit_ppo.sh", ("--env", "NOEQUALS", "--", "x"), "NAME=VALUE"),
        ("npu/submit_ppo.sh", ("--working-dir", "/nonexistent/dir", "--", "x"), "is not a directory"),
        ("npu/submit_ppo.sh", ("--dp", "2", "--", "x"), "unknown option --dp"),
        ("npu/submit_ppo.sh", ("--actor.x", "1"), "put the job's own arguments after --"),
        ("npu/submit_evalkit.sh", ("--", "--model", "m"), "--dp (number of data-parallel vLLM engines) is required"),
        ("npu/submit_evalkit.sh", ("--dp", "two", "--", "m"), "--dp must be a positive integer"),
        ("npu/submit_evalkit.sh", ("--dp", "2", "--module", "bad-name", "--", "m"), "Python module name"),
        ("gpu/submit_evalkit.sh", ("--", "m"), "--dp (number of data-parallel vLLM engines) is required"),
    ],
)
def test_submit_rejects_bad_input(script, args, message):
    proc = run(script, *args)
    assert proc.returncode in (1, 2), proc.stdout
    assert message in proc.stderr
    assert proc.stdout == ""


def test_gpu_scripts_mirror_npu_ones():
    _, command = dry_run_lines(run("gpu/start_ray_cluster.sh", "head", "--gpus", "4", "--dry-run"))
    assert command[:3] == ["ray", "start", "--num-gpus=4"]
    bad = run("gpu/start_ray_cluster.sh", "head", "--gpus", "-1")
    assert bad.returncode == 2 and "--gpus must be a positive integer" in bad.stderr
    _, command = dry_run_lines(run("gpu/submit_ppo.sh", "--dry-run", "--", "--x", "1"))
    assert _runtime_env(command)["env_vars"] == {"RLHF_EXT_DEVICE": "cuda"}
    assert command[command.index("--") + 1 :][:5] == [
        "python3",
        "-m",
        "openrlhf.cli.train_ppo_ray",
        "--plugin",
        "rlhf_ext",
    ]
