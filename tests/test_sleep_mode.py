"""``--vllm.enable_sleep`` / ``--ds.enable_sleep`` per target (rlhf_ext.patches.openrlhf.sleep_mode), through
OpenRLHF 0.11.2's real parser with the plugin's hook: off on the CPU target with one line, untouched on CUDA,
and on NPU (the stand-in torch_npu / vllm-ascend, tests/npu_standin) the allocator setting vllm-ascend's sleep
mode needs."""

import importlib.util
from pathlib import Path

import pytest

from rlhf_ext.patches.retarget import state

_spec = importlib.util.spec_from_file_location("npu_scenario_runner",
                                               Path(__file__).parent / "npu_scenarios" / "runner.py")
runner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runner)

SLEEP = ("--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep")
CPU_LINE = "rlhf_ext: --vllm.enable_sleep and --ds.enable_sleep are GPU/NPU memory features; off on the CPU target"


@pytest.fixture()
def target(monkeypatch):
    """The retarget's state as the driver of a run with ``RLHF_EXT_DEVICE=<backend>`` has it (the retarget
    itself is not applied in the pytest process: it patches torch process-wide)."""
    def set_target(backend):
        monkeypatch.setattr(state, "_applied", backend)
        monkeypatch.setenv("RLHF_EXT_DEVICE", backend)

    return set_target


def test_cpu_target_turns_both_flags_off_with_one_line(parse, capfd, target):
    target("cpu")
    args = parse(*SLEEP, "--algo.advantage.estimator", "reinforce", full=True)  # through OpenRLHF's own post-parse code too
    assert args.vllm.enable_sleep is False and args.ds.enable_sleep is False
    assert args.train.colocate_all is True  # the colocation itself is kept
    err = capfd.readouterr().err
    assert [line for line in err.splitlines() if "enable_sleep" in line] == [CPU_LINE]


@pytest.mark.parametrize("flags, line", [
    (("--train.colocate_all", "--vllm.enable_sleep"),
     "rlhf_ext: --vllm.enable_sleep is a GPU/NPU memory feature; off on the CPU target"),
    (("--train.colocate_all", "--ds.enable_sleep"),
     "rlhf_ext: --ds.enable_sleep is a GPU/NPU memory feature; off on the CPU target"),
    (("--train.colocate_all",), None),
])  # fmt: skip
def test_cpu_target_names_only_the_flags_given(parse, capfd, target, flags, line):
    target("cpu")
    args = parse(*flags)
    assert args.vllm.enable_sleep is False and args.ds.enable_sleep is False
    lines = [x for x in capfd.readouterr().err.splitlines() if "enable_sleep" in x]
    assert lines == ([line] if line else [])


def test_cuda_leaves_the_flags_alone(parse, capfd, target):
    target("cuda")
    args = parse(*SLEEP, "--algo.advantage.estimator", "reinforce", full=True)
    assert args.vllm.enable_sleep is True and args.ds.enable_sleep is True
    assert "enable_sleep" not in capfd.readouterr().err


def test_finalize_without_the_parser():
    """The seam's contract on its own: a namespace in, flags and exported variables out."""
    import io
    from types import SimpleNamespace

    from rlhf_ext.patches.openrlhf.sleep_mode import finalize

    def ns(**kw):
        return SimpleNamespace(**{"vllm.enable_sleep": False, "ds.enable_sleep": False,
                                  "train.colocate_all": True, **kw})

    err = io.StringIO()
    n = ns(**{"vllm.enable_sleep": True})
    assert finalize(n, backend="cpu", environ={}, stderr=err) == {}
    assert getattr(n, "vllm.enable_sleep") is False and err.getvalue().count("\n") == 1
    err = io.StringIO()
    assert finalize(ns(**{"vllm.enable_sleep": True}), backend="npu", environ={}, stderr=err) == {
        "RLHF_EXT_NPU_SLEEP_MODE": "1", "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:False"}
    with pytest.raises(ValueError, match="refuses"):
        finalize(ns(**{"vllm.enable_sleep": True}), backend="npu",
                 environ={"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}, stderr=io.StringIO())


# --- NPU target (stand-in): a fresh interpreter each, as the device shims patch torch process-wide ----------

@pytest.fixture(scope="module")
def npu():
    return runner.run_scenario("openrlhf_npu_sleep.py", standin=True, timeout=300)


@pytest.fixture(scope="module")
def npu_user_expandable():
    return runner.run_scenario("openrlhf_npu_sleep.py", standin=True, timeout=300,
                               env={"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True", "SCENARIO_USER_ALLOC": "1"})


def _ok(result):
    assert not (isinstance(result, dict) and "error" in result), result
    return result


def test_npu_rlhf_ext_default_gives_way_to_sleep_mode(npu):
    assert npu["backend"] == "npu"
    assert npu["alloc_at_start"] == "expandable_segments:True"  # rlhf_ext's own NPU default (hccl_env)
    result = _ok(npu["rlhf_ext_default"])
    assert result["vllm_sleep"] is True and result["ds_sleep"] is True  # kept: NPU has sleep mode
    assert result["env"] == {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:False", "RLHF_EXT_NPU_SLEEP_MODE": "1"}
    assert result["worker_default"] == "expandable_segments:False"  # a Ray worker's own default follows
    assert len(result["lines"]) == 1 and "PYTORCH_NPU_ALLOC_CONF=expandable_segments:False" in result["lines"][0]


def test_npu_user_setting_without_expandable_segments_is_kept(npu):
    result = _ok(npu["user_other_options"])
    assert result["env"]["PYTORCH_NPU_ALLOC_CONF"] == "max_split_size_mb:256"
    assert len(result["lines"]) == 1 and "max_split_size_mb:256 kept" in result["lines"][0]


@pytest.mark.parametrize("case", ["user_expandable_with_more", "user_expandable"])
def test_npu_user_expandable_segments_with_sleep_is_refused_at_start_up(npu, npu_user_expandable, case):
    result = _ok((npu if case in npu else npu_user_expandable)[case])
    assert result["exit"] == 2
    line = result["stderr_tail"][0]
    assert "--vllm.enable_sleep on NPU" in line and "expandable_segments:True" in line
    assert "expandable_segments:False" in line and "drop --vllm.enable_sleep" in line


@pytest.mark.parametrize("case", ["no_colocate", "ds_only", "no_sleep"])
def test_npu_without_vllm_sleep_mode_nothing_changes(npu, case):
    result = _ok(npu[case])
    assert result["env"] == {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True", "RLHF_EXT_NPU_SLEEP_MODE": None}
    assert result["lines"] == [] and result["worker_default"] == "expandable_segments:True"


# --- for the end-to-end mode matrix (called by the lead's matrix fixture; no run of its own here) ----------

COLOCATE_SLEEP_TIS_FLAGS = [
    "--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep",
    "--actor.policy_loss_type", "noclip", "--algo.advantage.is_correction_level", "token",
    "--algo.advantage.is_correction_mode", "clip", "--algo.advantage.is_correction_threshold", "2.0",
]  # fmt: skip
"""Added to ``rlhf_ext.tours.smoke.train_command(..., estimator="passk", steps=2, prompts_per_step=4,
n_samples=4)``: issue 38's colocate-all recipe with sleep, and OpenRLHF's one-value TIS with an rlhf_ext loss."""


def check_colocate_sleep_tis_run(output, rc, text, steps=2):
    """Assertions on such a run (``output``: train_command's ``output``; ``text``: the training log)."""
    import json

    from rlhf_ext.runs.check import check_run
    from rlhf_ext.tours.smoke import parse_train_log, run_record_dir

    assert rc == 0, text[-3000:]
    assert text.count(CPU_LINE) == 1 and "Sleep mode is not supported" not in text
    assert len(parse_train_log(text).steps) == steps
    record = run_record_dir(Path(output))
    args = json.loads((record / "config.json").read_text())["args"]
    assert args["train.colocate_all"] is True and args["vllm.enable_sleep"] is False and args["ds.enable_sleep"] is False
    assert args["algo.advantage.is_correction_threshold"] == [0.0, 2.0] and args["actor.policy_loss_type"] == "noclip"
    rows = [json.loads(line) for line in (record / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == steps
    for row in rows:  # the correction ran on rlhf_ext's loss: TIS weights capped at 2, OpenRLHF's metrics filled
        assert 0 < row["rollout_corr/weight_max"] <= 2.0 and 0 <= row["rollout_corr/is_truncated_fraction"] <= 1
        assert "train/vllm_kl" in row and "train/is_filter_ratio" in row
    assert check_run(record).passed
