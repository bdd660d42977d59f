"""``--rlhf_ext.mismatch_metrics`` inside OpenRLHF 0.11.2: flags, the log-prob request, the metrics'
way into the step's logs, the once-per-run warning and its event hook, and an untouched loss.

The flags run OpenRLHF's real CLI module body (runpy) with the plugin's argparse hook, stopped right
after parsing. The whole path with real vLLM and Ray is checked by the CPU training run in
tests/test_e2e_cpu_train.py (the smoke recipe turns the flag on).
"""

import importlib.machinery
import inspect
import os
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from rlhf_ext.patches.openrlhf import mismatch

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def plugin_driver(plugin_driver):
    """The shared driver (conftest.py), plus the rollout module these tests read patched."""
    import openrlhf.trainer.ppo_utils.samples_generator  # noqa: F401  (patched on import)


def test_flag_turns_on_metrics_without_importance_sampling(parse):
    os.environ.pop(mismatch.ENV_FLAG, None)
    args = parse("--rlhf_ext.mismatch_metrics")
    assert args.rlhf_ext.mismatch_metrics is True
    assert args.rlhf_ext.mismatch_threshold == 0.005
    assert args.algo.advantage.is_correction_level == "off"  # the loss stays OpenRLHF's plain one
    assert os.environ[mismatch.ENV_FLAG] == "1"  # for create_vllm_engines in the driver
    assert mismatch.enabled(args) and mismatch.threshold(args) == 0.005


def test_default_is_off(parse):
    os.environ.pop(mismatch.ENV_FLAG, None)
    args = parse()
    assert args.rlhf_ext.mismatch_metrics is False and not mismatch.enabled(args)
    assert mismatch.ENV_FLAG not in os.environ


@pytest.mark.parametrize("argv, message", [
    (["--rlhf_ext.mismatch_threshold", "0.01"], "needs --rlhf_ext.mismatch_metrics"),
    (["--rlhf_ext.mismatch_metrics", "--rlhf_ext.mismatch_threshold", "-1"], "must be a positive number"),
    (["--rlhf_ext.mismatch_metrics", "--rlhf_ext.mismatch_threshold", "nan"], "must be a positive number"),
])  # fmt: skip
def test_bad_threshold_is_an_argparse_error(parse, capfd, argv, message):
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2
    assert message in capfd.readouterr().err


def test_create_vllm_engines_asks_for_processed_logprobs(monkeypatch):
    from openrlhf.trainer.ray import vllm_engine

    calls = []

    def record(*args, **kwargs):
        calls.append(inspect.signature(record).bind(*args, **kwargs).arguments)

    record.__signature__ = inspect.signature(vllm_engine.create_vllm_engines)  # the real parameter list
    patched = mismatch.make_create_vllm_engines(record)
    positional = (1, 1, "model", 42, False, False, True, 64, None, 0.5, False)  # as train_ppo_ray passes them

    monkeypatch.delenv(mismatch.ENV_FLAG, raising=False)
    patched(*positional, None, agent_func_path=None)
    assert calls[-1]["logprobs_mode"] is None
    monkeypatch.setenv(mismatch.ENV_FLAG, "1")
    patched(*positional, None, agent_func_path=None)
    assert calls[-1]["logprobs_mode"] == "processed_logprobs" and calls[-1]["pretrain"] == "model"
    patched(*positional, agent_func_path=None)  # logprobs_mode not passed at all
    assert calls[-1]["logprobs_mode"] == "processed_logprobs"
    patched(*positional, "raw_logprobs")  # the caller's own choice wins
    assert calls[-1]["logprobs_mode"] == "raw_logprobs"


def test_rollout_requests_carry_logprobs_only_when_enabled(plugin_driver):
    from openrlhf.trainer.ppo_utils import samples_generator as sg
    from vllm import SamplingParams

    from rlhf_ext.patches.openrlhf import compat

    assert "rollout log-probs request (SamplingParams)" in compat.applied()[sg.__name__]
    assert sg.SamplingParams is not SamplingParams  # the name inside samples_generator is patched

    def dispatch_like_openrlhf(self, prompts, labels, *, images=None, **generate_kwargs):
        # what the real method does first: build the request's SamplingParams through the module's name
        return sg.SamplingParams(temperature=1.0, max_tokens=4,
                                 logprobs=1 if self.args.algo.advantage.is_correction_level != "off" else None)

    wrapped = mismatch.make_dispatch_prompts_to_vllm(dispatch_like_openrlhf)

    def args(on, level="off"):
        return SimpleNamespace(rlhf_ext=SimpleNamespace(mismatch_metrics=on),
                               algo=SimpleNamespace(advantage=SimpleNamespace(is_correction_level=level)))

    on = wrapped(SimpleNamespace(args=args(True)), ["p"], ["l"])
    off = wrapped(SimpleNamespace(args=args(False)), ["p"], ["l"])
    both = wrapped(SimpleNamespace(args=args(True, "token")), ["p"], ["l"])
    assert isinstance(on, SamplingParams) and on.logprobs == 1
    assert off.logprobs is None
    assert both.logprobs == 1
    assert sg.SamplingParams(temperature=1.0, max_tokens=4).logprobs is None  # outside a dispatch: untouched


def test_loss_ignores_rollout_logprobs_with_correction_off():
    from openrlhf.models.loss import PolicyLoss

    torch.manual_seed(0)
    lp = -torch.rand(3, 5)
    old = lp + 0.05 * torch.randn(3, 5)
    adv = torch.randn(3, 5)
    mask = torch.ones(3, 5, dtype=torch.bool)
    rollout = old + 0.3 * torch.randn(3, 5)
    loss = PolicyLoss(0.2, 0.28)
    with_rollout = loss(lp, old, adv, mask, rollout_log_probs=rollout)
    without = loss(lp, old, adv, mask, rollout_log_probs=None)
    assert torch.equal(with_rollout[0], without[0])
    assert with_rollout[3] is None  # no vllm_kl: OpenRLHF's correction path did not run


def _experience(train_p, rollout_p, mask):
    from openrlhf.trainer.ppo_utils.experience import Experience

    return Experience(
        action_mask=torch.tensor(mask, dtype=torch.bool),
        action_log_probs=torch.tensor(train_p).log(),
        rollout_log_probs=torch.tensor(rollout_p).log(),
        info={"reward": torch.zeros(len(mask))},
    )


def _maker(**flags):
    node = SimpleNamespace(mismatch_metrics=True, **flags)
    return SimpleNamespace(strategy=SimpleNamespace(args=SimpleNamespace(rlhf_ext=node)))


def test_step_metrics_pool_every_response_token_of_the_batch():
    exps = [_experience([[0.5, 0.3, 0.2]], [[0.4, 0.9, 0.2]], [[1, 0, 1]]),
            _experience([[0.9, 0.5], [0.5, 0.5]], [[0.8, 0.5], [0.5, 0.5]], [[1, 1], [0, 0]])]  # fmt: skip
    metrics = mismatch.step_metrics(exps)
    # response tokens: (0.5, 0.4), (0.2, 0.2), (0.9, 0.8), (0.5, 0.5) -> |P - Q| = 0.1, 0, 0.1, 0
    assert metrics["rollout_mismatch/tokens"] == 4
    assert metrics["rollout_mismatch/probs_diff_mean"] == pytest.approx(0.05, rel=1e-6)
    assert metrics["rollout_mismatch/probs_diff_max"] == pytest.approx(0.1, rel=1e-6)
    assert all(k.startswith("rollout_mismatch/") for k in metrics)
    no_rollout = _experience([[0.5]], [[0.5]], [[1]])
    no_rollout.rollout_log_probs = None
    assert mismatch.step_metrics([no_rollout]) is None
    bad = _experience([[0.5, 0.5]], [[0.5, 0.5]], [[1, 1]])
    bad.rollout_log_probs = bad.rollout_log_probs[:, :1]
    with pytest.raises(ValueError, match="shapes differ"):
        mismatch.step_metrics([bad])


def test_batch_gets_metrics_in_info_and_one_warning_per_run(capfd, monkeypatch):
    events = []
    hook = types.ModuleType(mismatch.RUN_RECORD_MODULE)
    hook.__spec__ = importlib.machinery.ModuleSpec(mismatch.RUN_RECORD_MODULE, None)
    hook.emit_event = events.append
    monkeypatch.setitem(sys.modules, mismatch.RUN_RECORD_MODULE, hook)

    batches = iter([
        [_experience([[0.5, 0.9]], [[0.5, 0.9]], [[1, 1]])],           # identical: no warning
        [_experience([[0.5, 0.9], [0.2, 0.2]], [[0.4, 0.8], [0.1, 0.2]], [[1, 1], [1, 0]])],  # 0.1 > 0.005
        [_experience([[0.5, 0.9]], [[0.3, 0.6]], [[1, 1]])],           # worse, but warned already
    ])  # fmt: skip
    make = mismatch.make_make_experience_batch(lambda self, samples: next(batches))
    maker = _maker(mismatch_threshold=0.005)

    first = make(maker, None)
    assert first[0].info["rollout_mismatch/probs_diff_mean"].tolist() == [0.0]
    assert "warning" not in capfd.readouterr().err and events == []

    second = make(maker, None)
    values = second[0].info["rollout_mismatch/probs_diff_mean"]
    assert values.shape == (2,) and values.tolist() == pytest.approx([0.1, 0.1], rel=1e-6)  # one per sample
    assert second[0].info["rollout_mismatch/tokens"].tolist() == [3.0, 3.0]
    err = capfd.readouterr().err
    assert "rollout_mismatch/probs_diff_mean = 0.1 exceeds 0.005 (rollout batch 2)" in err
    assert "rollout dtype" in err and "FP8" in err and "rlhf-ext alignment" in err
    assert len(events) == 1
    event = events[0]
    assert event["event"] == "mismatch_warning" and event["metric"] == "rollout_mismatch/probs_diff_mean"
    assert event["value"] == pytest.approx(0.1, rel=1e-6) and event["threshold"] == 0.005
    assert event["rollout_batch"] == 2 and event["message"] in err

    make(maker, None)
    assert "warning" not in capfd.readouterr().err and len(events) == 1


def test_without_a_run_record_the_warning_is_only_logged(monkeypatch):
    monkeypatch.setattr(mismatch, "RUN_RECORD_MODULE", "rlhf_ext.patches.openrlhf.no_such_module")
    assert mismatch.emit_event({"event": "mismatch_warning"}) is False


def test_disabled_or_missing_rollout_logprobs(capfd):
    exp = _experience([[0.5]], [[0.4]], [[1]])
    make = mismatch.make_make_experience_batch(lambda self, samples: [exp])
    off = SimpleNamespace(strategy=SimpleNamespace(args=SimpleNamespace()))  # an args without the plugin's flags
    make(off, None)
    assert not any(k.startswith("rollout_mismatch/") for k in exp.info)

    exp.rollout_log_probs = None
    maker = _maker()
    make(maker, None)
    make(maker, None)
    err = capfd.readouterr().err
    assert err.count("carry no rollout log-probs") == 1
    assert not any(k.startswith("rollout_mismatch/") for k in exp.info)


def test_nan_logprobs_skip_the_metrics_and_say_why(capfd):
    exp = _experience([[0.5, 0.5]], [[0.4, 0.4]], [[1, 1]])
    exp.action_log_probs[0, 1] = float("nan")
    make = mismatch.make_make_experience_batch(lambda self, samples: [exp])
    make(_maker(), None)
    assert "rollout_mismatch skipped for rollout batch 1: NaN log-probabilities" in capfd.readouterr().err
    assert not any(k.startswith("rollout_mismatch/") for k in exp.info)


def test_smoke_run_echoes_the_mismatch_per_step(tmp_path, capsys):
    from rlhf_ext.tours.smoke import run_training, train_command

    assert "--rlhf_ext.mismatch_metrics" in train_command(model=tmp_path, prompts=tmp_path / "p.jsonl", output=tmp_path)
    line = "(PPOTrainer pid=1) Global step 1: {'reward': 0.5, 'score': 0.25, 'rollout_mismatch/probs_diff_mean': 0.0123}"
    assert run_training(["echo", line], tmp_path / "t.log", timeout=60, echo=True) == 0
    assert "step   1  reward 0.500  accuracy 0.250  kl 0.0000  rollout |dp| 0.0123" in capsys.readouterr().out


def test_cpu_shim_lets_inductor_key_its_cache():
    # vLLM compiles its log-prob ranking with torch inductor, whose cache key reads the device
    # properties that the CPU retarget (RLHF_EXT_DEVICE=cpu) answers for torch.cuda
    import subprocess

    code = ("from rlhf_ext.npu.cpu_shim import transfer_to_cpu; transfer_to_cpu()\n"
            "from torch._inductor.codecache import CacheBase\n"
            "print(CacheBase.get_system()['device'])")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "'name': 'cpu'" in out.stdout
