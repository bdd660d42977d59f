"""Issue 23 on MindSpeed-RL 2.1.0: the engine's log-probs through the generate step and the transfer
dock into the real GRPO/DAPO actor losses, corrected by rlhf_ext.algorithms.rollout_correction.

Real MindSpeed-RL code throughout: the patched ``RLConfig`` / ``validate_rl_args`` / ``GenerateConfig``,
``VLLMInferEngine.generate_sequences`` and ``_post_process_outputs``, the actor worker's
``sync_generate_process`` and ``collect_transfer_dock_data``, ``DataStrategy.build_grpo`` with a real
``GRPOTransferDock`` actor, and the losses through ``LossFuncFactory``. Stood in: what only runs on
an Ascend machine -- vLLM's ``LLM.generate`` (returns request outputs built here, shaped like
vLLM's), vLLM's parallel state (one rank), and Megatron's log-prob computation (the log-probs
under test, as MindSpeed-RL's own loss tests do).
"""

import math
from types import SimpleNamespace
from unittest.mock import patch

import pytest
import torch

from rlhf_ext.patches.mindspeed_rl import ConfigError, ConfiguredName, compat

L3, L2, L15 = math.log(3.0), math.log(2.0), math.log(1.5)
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]]).bool()
LENGTHS = torch.tensor([[3], [1]])
OLD = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, 0.0, 0.0]])
# pi / pi_old = [[1.5, 1, 1], [0.5]] with A = [[1, 1, 1], [-2]]: PPO (eps 0.2) per-token [[-1.2, -1, -1], [1.6]]
LOG_PROBS = OLD + torch.tensor([[L15, 0.0, 0.0], [math.log(0.5), 7.0, 7.0]])
ADVANTAGES = torch.tensor([[1.0, 1.0, 1.0], [-2.0, 9.0, 9.0]])
PER_TOKEN = [-1.2, -1.0, -1.0, 1.6]
# d = log pi_old - log pi_rollout = [[log 3, log 0.5, 0], [log 1.5]]: raw token ratios [3, 0.5, 1, 1.5]
D = torch.tensor([[L3, -L2, 0.0], [L15, 0.0, 0.0]])
ROLLOUT = torch.where(MASK, OLD - D, torch.full_like(OLD, 151643.0))  # padding: the pad id, as the engine pads


def rl_config(**values):
    from mindspeed_rl.config_cls.rl_config import RLConfig

    return RLConfig(values)


def correction_settings(**values):
    return rl_config(**values).kl_penalty.settings


# ---- config time ----------------------------------------------------------------------------------


def test_keys_travel_with_kl_penalty_and_build_the_framework_free_config():
    import pickle

    from rlhf_ext.algorithms import RolloutCorrection
    from rlhf_ext.patches.mindspeed_rl.config import rollout_correction_of

    cfg = rl_config(rollout_is="geometric", rollout_is_threshold=[0.5, 2.0], rollout_is_batch_normalize=True,
                    rollout_rs="seq_mean_k3,token_ratio", rollout_rs_threshold=[0.01, "0.2_5"])
    spec = cfg.kl_penalty.settings["rollout_correction"]
    assert spec == {"is_level": "geometric", "is_threshold": [0.5, 2.0], "batch_normalize": True,
                    "rejection": {"seq_mean_k3": 0.01, "token_ratio": "0.2_5"}, "bypass": False}
    assert isinstance(cfg.kl_penalty, ConfiguredName) and cfg.kl_penalty == "low_var_kl"
    back = pickle.loads(pickle.dumps(cfg))  # Ray pickles rl_config to the trainer and the workers
    assert rollout_correction_of(back.kl_penalty.settings) == (RolloutCorrection(
        is_level="geometric", is_threshold=(0.5, 2.0), batch_normalize=True,
        rejection={"seq_mean_k3": 0.01, "token_ratio": "0.2_5"}), False)
    one_for_all = correction_settings(rollout_rs="token_k3,seq_max_k2", rollout_rs_threshold="0.5",
                                      rollout_correction_bypass=True)["rollout_correction"]
    assert one_for_all["rejection"] == {"token_k3": "0.5", "seq_max_k2": "0.5"} and one_for_all["bypass"]
    assert one_for_all["is_level"] is None


def test_switched_off_keys_change_nothing():
    plain = rl_config(adv_estimator="group_norm", kl_penalty="low_var_kl")
    off = rl_config(adv_estimator="group_norm", kl_penalty="low_var_kl", rollout_is=None, rollout_rs=None,
                    rollout_correction_bypass=False, rollout_is_batch_normalize=False)
    assert off.dict() == plain.dict()
    assert type(off.kl_penalty) is str and not hasattr(off, "rollout_is")
    from mindspeed_rl.config_cls.rl_config import RLConfig

    with pytest.raises(ValueError, match="key: rollout_is is missing"):  # MindSpeed-RL's own unknown key
        RLConfig.__init__.__wrapped__(RLConfig.__new__(RLConfig), {"rollout_is": None})


@pytest.mark.parametrize("values, message", [
    ({"rollout_is": "tokens"}, r"rl_config.rollout_is='tokens' is not known; valid: token, sequence, geometric"),
    ({"rollout_is": "token", "rollout_is_threshold": -1}, r"rl_config.rollout_is_threshold: .*positive"),
    ({"rollout_is": "token", "rollout_is_threshold": [5, 2]}, r"rl_config.rollout_is_threshold: .*lower 5.0 > upper 2.0"),
    ({"rollout_rs": "seq_mean_k3"}, r"rl_config.rollout_rs needs rl_config.rollout_rs_threshold"),
    ({"rollout_rs": "seq_mean_k9", "rollout_rs_threshold": 1}, r"rl_config.rollout_rs: unknown rejection option 'seq_mean_k9'"),
    ({"rollout_rs": "a,b", "rollout_rs_threshold": [1, 2, 3]}, r"3 thresholds for 2 rollout_rs options"),
    ({"rollout_rs": "token_k3", "rollout_rs_threshold": "0.1_2"}, r"'token_k3' takes an upper bound only"),
    ({"rollout_rs_threshold": 1.0}, r"rollout_rs_threshold needs rl_config.rollout_rs"),
    ({"rollout_correction_bypass": True}, r"rl_config.rollout_correction_bypass needs rl_config.rollout_is or"),
    ({"rollout_is": "token", "rollout_correction_bypass": "yes"}, r"rollout_correction_bypass must be true or false"),
    ({"rollout_is": "token", "partial_rollout_max_split": 2}, r"partial_rollout_max_split=2 cannot be combined"),
    ({"rollout_is": "token", "async_engine": True}, r"async_engine=True cannot be combined .*async generate path"),
    ({"rollout_is": "token", "multi_turn_enable": True}, r"multi_turn_enable=True cannot be combined"),
    ({"rollout_is": "token", "filter_groups_enable": True}, r"filter_groups_enable=True cannot .*dynamic_sampling"),
    ({"rollout_is": "token", "data_strategy": "tq"}, r"data_strategy='tq' cannot be combined .*transfer queue"),
])
def test_invalid_or_unsupported_settings_are_refused_with_the_reason(values, message):
    with pytest.raises(ConfigError, match=message):
        rl_config(**values)


def generate_config(**sampling):
    from mindspeed_rl.config_cls.generate_config import GenerateConfig

    return GenerateConfig({"sampling_config": sampling})


GOOD_SAMPLING = {"logprobs": 1, "temperature": 1.0, "top_k": -1, "top_p": 1.0, "min_p": 0.0}


@pytest.mark.parametrize("sampling, stage, message", [
    ({**GOOD_SAMPLING, "temperature": 0.7}, "ray_grpo",
     r"sampling_config.temperature=0.7: MindSpeed-RL 2.1.0's engine builds vLLM's LLM\(...\) without logprobs_mode, "
     r"so vLLM returns raw_logprobs .* Set sampling_config.temperature: 1.0"),
    ({**GOOD_SAMPLING, "top_k": 50}, "ray_dapo", r"sampling_config.top_k=50: .*Set sampling_config.top_k: -1"),
    ({**GOOD_SAMPLING, "top_p": 0.9}, "ray_grpo", r"sampling_config.top_p=0.9"),
    ({**GOOD_SAMPLING, "min_p": 0.05}, "ray_grpo", r"sampling_config.min_p=0.05"),
    ({**GOOD_SAMPLING, "logprobs": None}, "ray_grpo", r"sampling_config.logprobs is null"),
    (GOOD_SAMPLING, "ray_ppo", r"megatron_training.stage=ray_ppo: rlhf_ext applies it in the GRPO and DAPO"),
])
def test_validate_rl_args_refuses_sampling_the_trainer_does_not_replay(sampling, stage, message):
    from mindspeed_rl.config_cls.validate_config import validate_rl_args

    actor = SimpleNamespace(stage=stage)
    with pytest.raises(ConfigError, match=message):
        validate_rl_args(actor, actor, actor, rl_config(rollout_is="token"), generate_config(**sampling))


def test_the_engine_defaults_count_when_sampling_config_omits_a_key():
    """MindSpeed-RL's engine reads sampling_config.get('temperature', 0.2) / get('top_k', 50)."""
    from rlhf_ext.patches.mindspeed_rl.rollout_correction import check_sampling

    with pytest.raises(ConfigError, match=r"temperature=0.2 \(not set: the engine's default 0.2\)"):
        check_sampling({"top_k": -1}, "ray_grpo")
    with pytest.raises(ConfigError, match=r"top_k=50 \(not set: the engine's default 50\)"):
        check_sampling({"temperature": 1}, "ray_grpo")
    check_sampling(GOOD_SAMPLING, "ray_grpo")
    check_sampling({**GOOD_SAMPLING, "top_k": 0}, "ray_dapo")
    # GenerateConfig's own class defaults (temperature 0.2, top_k 50) are refused too
    with pytest.raises(ConfigError, match="top_k=50"):
        check_sampling({**generate_config().sampling_config, "temperature": 1.0}, "ray_grpo")


def _cli_module(script):
    import importlib.util
    import os

    from conftest import mindspeed_src

    spec = importlib.util.spec_from_file_location(f"ms_cli_{script}", os.path.join(mindspeed_src(), "cli", script + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _composed(config_name, *overrides):
    import os

    from conftest import mindspeed_src
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=os.path.join(mindspeed_src(), "configs"), version_base=None):
        return compose(config_name=config_name, overrides=list(overrides))


def test_mindspeed_rls_own_config_parsing_applies_the_rules():
    """cli/train_grpo.py's parse_training_config (what its ``train`` task runs first) on a shipped recipe."""
    cli = _cli_module("train_grpo")
    with pytest.raises(ConfigError, match=r"sampling_config.temperature=0.7: MindSpeed-RL 2.1.0's engine"):
        cli.parse_training_config(_composed("grpo_qwen25_7b_A3", "+rl_config.rollout_is=token",
                                            "generate_config.sampling_config.temperature=0.7"))
    # the recipe samples at temperature 1, top_k -1, top_p 1: it passes (MindSpeed-RL's own checks count
    # the Ray nodes: one node here, without asking a cluster)
    from mindspeed_rl.config_cls import validate_config

    with patch.object(validate_config, "get_node_nums", return_value=1):
        parsed = cli.parse_training_config(_composed("grpo_qwen25_7b_A3", "+rl_config.rollout_is=token"))
    assert parsed["rl_config"].kl_penalty.settings["rollout_correction"]["is_level"] == "token"
    assert parsed["generate_config"].sampling_config["temperature"] == 1.0


def test_validate_rl_args_without_correction_is_mindspeed_rls():
    from mindspeed_rl.config_cls import validate_config

    from rlhf_ext.patches.mindspeed_rl.rollout_correction import make_validate_rl_args

    assert validate_config.validate_rl_args.__wrapped__ is compat.original(validate_config, "validate_rl_args")
    calls = []
    wrapped = make_validate_rl_args(lambda *a: calls.append(a) or "done")
    actor = SimpleNamespace(stage="ray_ppo")
    assert wrapped(actor, actor, actor, rl_config(), generate_config(temperature=0.3)) == "done"
    assert wrapped(actor, actor, actor, rl_config(rollout_is=None), generate_config(temperature=0.3)) == "done"
    assert len(calls) == 2 and calls[0][5:] == (None, None)


# ---- the engine and the generate step ---------------------------------------------------------------

PAD, EOD = 0, 1


def request_outputs(rows):
    """vLLM RequestOutput-shaped objects: per request, its completions' token ids and per-token logprob dicts."""
    out = []
    for completions in rows:
        outputs = [SimpleNamespace(token_ids=list(ids), logprobs=[{t: SimpleNamespace(logprob=lp)} for t, lp in zip(ids, lps)])
                   for ids, lps in completions]
        out.append(SimpleNamespace(outputs=outputs))
    return out


def engine_with(rows, tokenizer):
    from mindspeed_rl.models.rollout.vllm_engine import VLLMInferEngine

    engine = object.__new__(VLLMInferEngine)  # no vLLM-Ascend here: the LLM is stood in below
    engine.pad_token_id = PAD
    engine.sampling_params = SimpleNamespace(n=2)
    engine.tokenizer = SimpleNamespace(tokenizer=tokenizer)
    engine.init_cache_engine = engine.free_cache_engine = lambda: None
    engine.llm = SimpleNamespace(generate=lambda prompts, sampling_params, use_tqdm: request_outputs(rows))
    return engine


# Two prompts, two samples each. Row 2 stops on a stop string without sampling EOD, so MindSpeed-RL's
# remove_padding_and_split_to_list (pad 0 != eod 1 here: cut at the first pad) keeps it whole; row 1
# sampled EOD and is padded; row 3 fills the budget.
ENGINE_ROWS = [
    [([7, 8, EOD], [-0.1, -0.2, -0.3]), ([9, 10, 11, 12], [-0.4, -0.5, -0.6, -0.7])],
    [([13, EOD], [-0.8, -0.9]), ([14, 15, 16, 17], [-1.0, -1.1, -1.2, -1.3])],
]


def test_post_process_outputs_keeps_each_rows_log_probs_at_its_own_length(tiny_tokenizer):
    from mindspeed_rl.models.rollout.vllm_engine import VLLMInferEngine

    from rlhf_ext.patches.mindspeed_rl.rollout_correction import STASH

    engine = engine_with(ENGINE_ROWS, tiny_tokenizer)
    ids, lps = engine.generate_sequences([[20, 21], [22]])  # MindSpeed-RL's own generate_sequences
    want_ids, want_lps = compat.original(VLLMInferEngine, "_post_process_outputs")(engine, request_outputs(ENGINE_ROWS))
    assert torch.equal(ids, want_ids) and torch.equal(lps, want_lps)  # its return value is untouched
    assert lps[0, 3].item() == PAD  # the padded tensor pads log-probs with the pad id: lengths are lost there
    stash = getattr(engine, STASH)
    assert [r.tolist() for r in stash] == [pytest.approx(lp) for _, lp in (ENGINE_ROWS[0] + ENGINE_ROWS[1])]


def actor_worker(rl, engine, put):
    from mindspeed_rl.models.actor_rollout_hybrid import ActorRolloutHybrid
    from mindspeed_rl.workers.actor_hybrid_worker import ActorHybridWorkerBase

    worker = object.__new__(ActorHybridWorkerBase)  # the Megatron/NPU state is never built here
    worker.rl_config = rl
    worker.enable_partial_rollout = False
    worker.tokenizer = SimpleNamespace(eod=EOD, pad=PAD, vocab_size=200)
    worker.actor_hybrid = object.__new__(ActorRolloutHybrid)
    worker.actor_hybrid.inference_actor = engine
    worker.sampling_transfer_dock = None
    worker.parallel_state = None
    worker.td = SimpleNamespace(put_experience=SimpleNamespace(remote=lambda data_dict, indexes: put.append((data_dict, indexes))))
    return worker


@pytest.fixture
def one_vllm_rank(monkeypatch):
    from vllm.distributed import parallel_state as vpu  # the stand-in: vLLM's parallel state of one rank

    monkeypatch.setattr(vpu, "get_pipeline_model_parallel_group", lambda: SimpleNamespace(is_last_rank=True), raising=False)
    monkeypatch.setattr(vpu, "get_tensor_model_parallel_rank", lambda: 0, raising=False)


def generate_step(rl, tiny_tokenizer):
    from mindspeed_rl.utils.pad_process import remove_padding_tensor_dict_to_dict

    put = []
    worker = actor_worker(rl, engine_with(ENGINE_ROWS, tiny_tokenizer), put)
    batch = {"prompts": torch.tensor([[20, 21], [20, 21], [22, 0], [22, 0]]),
             "prompt_length": torch.tensor([[2], [2], [1], [1]])}
    worker.sync_generate_process(batch, 4, [0, 1, 2, 3], PAD)  # MindSpeed-RL's own generate step
    (data, indexes), = put
    return remove_padding_tensor_dict_to_dict(data), indexes, worker


def test_sync_generate_step_stores_a_rollout_row_per_response(tiny_tokenizer, one_vllm_rank):
    from rlhf_ext.patches.mindspeed_rl.rollout_correction import COLUMN, STASH

    rows, indexes, worker = generate_step(rl_config(rollout_is="token"), tiny_tokenizer)
    assert indexes == [0, 1, 2, 3]
    responses = [r.tolist() for r in rows["responses"]]
    # pad 0 != eod 1: each response is cut at its first pad, so it is exactly the sampled tokens
    assert responses == [[7, 8, EOD], [9, 10, 11, 12], [13, EOD], [14, 15, 16, 17]]
    assert [r.tolist() for r in rows[COLUMN]] == [pytest.approx(lp) for _, lp in ENGINE_ROWS[0] + ENGINE_ROWS[1]]
    assert [int(n) for n in rows["response_length"]] == [len(r) for r in responses]
    assert getattr(worker.actor_hybrid.inference_actor, STASH) is None  # one step's rows, used once


def test_without_correction_the_generate_step_stores_mindspeed_rls_columns(tiny_tokenizer, one_vllm_rank):
    rows, _, _ = generate_step(rl_config(), tiny_tokenizer)
    assert sorted(rows) == ["input_ids", "response_length", "responses"]


def test_rows_follow_mindspeed_rls_cut_when_pad_is_eod():
    """pad == eod: a response stopped without sampling EOD gets one EOD appended that no engine sampled."""
    from mindspeed_rl.utils.pad_process import remove_padding_and_split_to_list

    from rlhf_ext.patches.mindspeed_rl.rollout_correction import NO_ROLLOUT_LOG_PROB, rollout_rows

    padded = torch.tensor([[7, 8, 1, 1], [9, 10, 11, 12], [13, 1, 1, 1]])  # row 2: stopped on a stop string
    engine_rows = [torch.tensor([-0.1, -0.2]), torch.tensor([-0.4, -0.5, -0.6, -0.7]), torch.tensor([-0.8])]
    responses = remove_padding_and_split_to_list(padded, 1, 1)
    assert [len(r) for r in responses] == [3, 4, 2]
    rows = rollout_rows(responses, engine_rows)
    assert rows[0].tolist() == pytest.approx([-0.1, -0.2, NO_ROLLOUT_LOG_PROB])
    assert rows[1].tolist() == pytest.approx([-0.4, -0.5, -0.6, -0.7])
    assert rows[2].tolist() == pytest.approx([-0.8, NO_ROLLOUT_LOG_PROB])
    with pytest.raises(RuntimeError, match="returned no log-probs"):
        rollout_rows(responses, None)
    with pytest.raises(RuntimeError, match="2 log-prob rows for 3 responses"):
        rollout_rows(responses, engine_rows[:2])


def test_the_update_asks_the_dock_for_the_column():
    from mindspeed_rl.workers.actor_hybrid_worker import ActorHybridWorkerBase

    from rlhf_ext.patches.mindspeed_rl.rollout_correction import COLUMN

    from rlhf_ext.patches.mindspeed_rl.rollout_correction import make_dispatch_transfer_dock_data

    asked = []
    worker = object.__new__(ActorHybridWorkerBase)
    columns = ["responses", "advantages", "old_log_prob"]
    seam = make_dispatch_transfer_dock_data(lambda self, stage, cols, *a, **k: asked.append((stage, cols, a, k)))
    for rl in (rl_config(rollout_rs="seq_max_k2", rollout_rs_threshold=1.0), rl_config()):
        worker.rl_config = rl
        seam(worker, "actor_train", columns, 8, 1, 1, None, indexes=None, get_n_samples=False)
        seam(worker, "actor_log_prob", columns, 8)
    assert asked[0] == ("actor_train", columns + [COLUMN], (8, 1, 1, None), {"indexes": None, "get_n_samples": False})
    assert asked[1][1] == columns and asked[2][1] == columns and asked[3][1] == columns
    assert columns == ["responses", "advantages", "old_log_prob"]  # MindSpeed-RL's local list is not mutated
    assert ActorHybridWorkerBase.dispatch_transfer_dock_data.__rlhf_ext_patch__ == \
        "rollout correction: the column to the actor update"


def test_build_passes_mindspeed_rls_columns_through_without_correction():
    from rlhf_ext.patches.mindspeed_rl.rollout_correction import COLUMN, make_build_with_column

    def build_grpo(self, prompts_num, n_samples_per_prompt, metrics, max_age, gbs_train, addition_columns=None,
                   reuse_image_embeds=False, dataset_additional_keys=None):
        return addition_columns

    build = make_build_with_column(build_grpo)
    assert build(SimpleNamespace(rl_config=rl_config()), 2, 2, None, 1, 2, ["label"]) == ["label"]
    assert build(SimpleNamespace(rl_config=rl_config()), 2, 2, None, 1, 2) is None
    on = SimpleNamespace(rl_config=rl_config(rollout_is="token"))
    assert build(on, 2, 2, None, 1, 2, ["label"]) == ["label", COLUMN]
    assert build(on, 2, 2, None, 1, 2, addition_columns=None) == [COLUMN]


def test_real_transfer_dock_carries_the_column_to_the_actor_train_stage(local_ray, tiny_tokenizer, one_vllm_rank):
    """DataStrategy.build_grpo (patched) makes a real GRPOTransferDock (a Ray actor) with the column;
    what the generate step stored comes back at the actor_train stage."""
    from mindspeed_rl.trainer.utils import data_strategy
    from mindspeed_rl.utils.metrics import Metric
    from mindspeed_rl.utils.pad_process import padding_dict_to_tensor_dict, remove_padding_tensor_dict_to_dict

    from rlhf_ext.patches.mindspeed_rl.rollout_correction import COLUMN

    dock_cls = data_strategy.GRPOTransferDock
    small = SimpleNamespace(remote=lambda **kw: dock_cls.options(num_cpus=0).remote(**kw))  # it asks for 10 CPUs
    rl = rl_config(rollout_is="token")
    rows, indexes, _ = generate_step(rl, tiny_tokenizer)
    with patch.object(data_strategy, "GRPOTransferDock", small):
        strategy = data_strategy.DataStrategy(rl)
        strategy.build_grpo(prompts_num=2, n_samples_per_prompt=2, metrics=Metric(), max_age=1, gbs_train=2)
    dock = strategy.td
    local_ray.get(dock.put_experience.remote(data_dict=padding_dict_to_tensor_dict(rows), indexes=indexes))
    got, got_index = local_ray.get(dock.get_experience.remote(
        "actor_train", ["responses", "response_length", COLUMN], 4, indexes=[0, 1, 2, 3], get_n_samples=False))
    got = remove_padding_tensor_dict_to_dict(got) if "original_length" in got.keys() else got
    by_index = dict(zip(got_index, range(len(got_index))))
    for i in range(4):
        row = got[COLUMN][by_index[i]]
        n = int(got["response_length"][by_index[i]])
        assert row[:n].tolist() == pytest.approx(rows[COLUMN][i].tolist())
    local_ray.kill(dock)


# ---- the actor losses ---------------------------------------------------------------------------------


def batch(rollout=ROLLOUT, with_column=True):
    b = {"responses": torch.full((2, 3), 5), "response_length": LENGTHS, "old_log_prob": OLD.clone(),
         "advantages": ADVANTAGES, "ref_log_prob": torch.zeros(2, 3)}
    if with_column:
        b["rollout_log_probs"] = rollout.clone()
    return b


def meta(settings):
    from mindspeed_rl.trainer.utils.compute_utils import FixedKLController

    return {"clip_ratio": 0.2, "kl_ctrl": FixedKLController(0.0), "entropy_coeff": 0.0,
            "kl_penalty": ConfiguredName("low_var_kl", settings), "token_level_loss": True,
            "clip_higher_enable": False, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2}


def run(stage, settings, b, log_probs=LOG_PROBS):
    from mindspeed_rl.models.loss.base_loss_func import BaseLossFunc
    from mindspeed_rl.models.loss.loss_func_factory import LossFuncFactory

    loss = LossFuncFactory.get_instance(stage, "actor")
    loss.add_loss_meta_info(meta(settings))
    with patch.object(BaseLossFunc, "compute_log_probs", return_value=(log_probs, torch.zeros(2, 3))):
        return loss.compute_loss(torch.zeros(1), b, forward_only=False)


def token_mean(weights):
    return sum(w * t for w, t in zip(weights, PER_TOKEN)) / 4


@pytest.mark.parametrize("stage", ["ray_grpo", "ray_dapo"])
@pytest.mark.parametrize("values", [
    {"rollout_is": "token"}, {"rollout_is": "sequence", "rollout_is_threshold": "0.5_2"},
    {"rollout_is": "geometric", "rollout_rs": "seq_mean_k3,token_ratio", "rollout_rs_threshold": [0.001, "0.9_1.1"]},
    {"rollout_rs": "seq_max_abs_log_ratio", "rollout_rs_threshold": 0.1, "rollout_correction_bypass": False},
])
def test_identical_log_probs_give_weights_one_and_the_same_loss_bit_for_bit(stage, values):
    rollout = torch.where(MASK, OLD, torch.full_like(OLD, 151643.0))
    settings = correction_settings(policy_loss_type="ppo", **values)
    lp = LOG_PROBS.clone().requires_grad_(True)
    loss, stats = run(stage, settings, batch(rollout), log_probs=lp)
    plain_lp = LOG_PROBS.clone().requires_grad_(True)
    plain, plain_stats = run(stage, {"policy_loss_type": "ppo"}, batch(with_column=False), log_probs=plain_lp)
    assert torch.equal(loss, plain)
    assert torch.equal(torch.autograd.grad(loss, lp)[0], torch.autograd.grad(plain, plain_lp)[0])
    assert stats["rollout_corr/weight_mean"] == 1.0 and stats["rollout_corr/weight_max"] == 1.0
    assert stats.get("rollout_corr/rejected_fraction", 0.0) == 0.0 and stats["rollout_corr/k1_kl"] == 0.0
    assert {k: v for k, v in stats.items() if not k.startswith("rollout_corr/")} == plain_stats


@pytest.mark.parametrize("stage", ["ray_grpo", "ray_dapo"])
@pytest.mark.parametrize("values, weights, extra", [
    # token TIS, C = 2: [3, 0.5, 1, 1.5] -> [2, 0.5, 1, 1.5]
    ({"rollout_is": "token"}, [2, 0.5, 1, 1.5], {"is_truncated_fraction": 0.25, "is_max": 2.0, "is_mean": 1.25}),
    # IcePop band [0.5, 2]: the ratio 3 drops to 0
    ({"rollout_is": "token", "rollout_is_threshold": [0.5, 2.0]}, [0, 0.5, 1, 1.5], {"is_truncated_fraction": 0.25}),
    # sequence: products 3 * 0.5 * 1 = 1.5 and 1.5
    ({"rollout_is": "sequence"}, [1.5, 1.5, 1.5, 1.5], {"is_mean": 1.5}),
    # geometric: 1.5 ** (1/3) and 1.5
    ({"rollout_is": "geometric"}, [1.5 ** (1 / 3)] * 3 + [1.5], {}),
    # rejection: max |d| of row 0 is log 3 > 1: the whole row drops (its tokens count as zero-loss tokens)
    ({"rollout_rs": "seq_max_abs_log_ratio", "rollout_rs_threshold": 1.0}, [0, 0, 0, 1],
     {"rejected_fraction": 0.75, "seq_rejected_fraction": 0.5}),
    # token TIS and token k3 rejection (k3(log 3) = 3 - 1 - log 3 = 0.90 > 0.5; k3(log 1.5) = 0.095)
    ({"rollout_is": "token", "rollout_rs": "token_k3", "rollout_rs_threshold": 0.5}, [0, 0.5, 1, 1.5],
     {"rejected_fraction": 0.25}),
])
def test_injected_mismatch_hand_computed(stage, values, weights, extra):
    loss, stats = run(stage, correction_settings(policy_loss_type="ppo", **values), batch())
    assert loss.item() == pytest.approx(token_mean(weights), rel=1e-6)
    for key, want in extra.items():
        assert stats["rollout_corr/" + key] == pytest.approx(want, rel=1e-6), key
    assert stats["rollout_corr/k1_kl"] == pytest.approx(-(L3 - L2 + 0 + L15) / 4, rel=1e-6)
    assert stats["rollout_corr/no_rollout_log_prob_fraction"] == 0.0


def test_bypass_takes_the_ppo_ratio_against_the_rollout_and_weights_from_the_current_policy():
    # log pi - log pi_rollout = [[log 4.5, log 0.5, 0], [log 0.75]]: PPO per-token [-1.2, -0.5, -1, 1.6],
    # TIS weights min(r, 2) = [2, 0.5, 1, 0.75]
    settings = correction_settings(policy_loss_type="ppo", rollout_is="token", rollout_correction_bypass=True)
    loss, stats = run("ray_grpo", settings, batch())
    assert loss.item() == pytest.approx((2 * -1.2 + 0.5 * -0.5 - 1 + 0.75 * 1.6) / 4, rel=1e-6)
    assert stats["rollout_corr/is_max"] == pytest.approx(2.0)


def test_skipped_old_log_prob_uses_the_current_policy():
    """skip_actor_log_prob (one update per rollout): no old_log_prob column, pi_old = pi."""
    b = batch(rollout=torch.where(MASK, LOG_PROBS - D, torch.zeros(2, 3)))
    del b["old_log_prob"]
    loss, stats = run("ray_grpo", correction_settings(policy_loss_type="ppo", rollout_is="token"), b)
    # ratio 1, so the PPO terms are -A = [-1, -1, -1, 2]; weights from d = D: [2, 0.5, 1, 1.5]
    assert loss.item() == pytest.approx((2 * -1 + 0.5 * -1 - 1 + 1.5 * 2) / 4, rel=1e-6)
    assert stats["rollout_corr/is_truncated_fraction"] == 0.25


def test_a_token_without_a_rollout_log_prob_counts_as_agreement():
    from rlhf_ext.patches.mindspeed_rl.rollout_correction import NO_ROLLOUT_LOG_PROB

    rollout = ROLLOUT.clone()
    rollout[0, 0] = NO_ROLLOUT_LOG_PROB  # the appended EOD of a pad == eod response
    loss, stats = run("ray_grpo", correction_settings(policy_loss_type="ppo", rollout_is="token"), batch(rollout))
    assert loss.item() == pytest.approx(token_mean([1, 0.5, 1, 1.5]), rel=1e-6)
    assert stats["rollout_corr/no_rollout_log_prob_fraction"] == 0.25


@pytest.mark.parametrize("name", ["cispo", "gspo", "sapo", "gmpo"])
def test_registered_losses_get_what_the_framework_free_function_says(name):
    """Random batch, every option kind at once: value and gradient equal the framework-free composition."""
    from rlhf_ext.algorithms import aggregate_loss, apply_rollout_correction, get_policy_loss, rollout_correction

    from rlhf_ext.patches.mindspeed_rl.config import rollout_correction_of

    g = torch.Generator().manual_seed(8)
    old = -torch.rand(2, 3, generator=g) * 2
    lp0 = old + torch.randn(2, 3, generator=g) * 0.1
    rollout = torch.where(MASK, old + torch.randn(2, 3, generator=g) * 0.3, torch.full((2, 3), 151643.0))
    settings = correction_settings(policy_loss_type=name, loss_agg_mode="seq-mean-token-mean", rollout_is="token",
                                   rollout_is_threshold=1.5, rollout_rs="token_k2", rollout_rs_threshold=0.02)
    b = batch(rollout)
    b["old_log_prob"] = old
    lp = lp0.clone().requires_grad_(True)
    loss, stats = run("ray_dapo", settings, b, log_probs=lp)
    want_lp = lp0.clone().requires_grad_(True)
    import inspect

    fn = get_policy_loss(name)
    params = inspect.signature(fn).parameters
    clip = {"eps_low": 0.2, "eps_high": 0.2} if "eps_low" in params else (
        {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2} if "clip_ratio_low" in params else {})
    per_token, _ = fn(want_lp, old, ADVANTAGES, MASK, **clip)
    result = rollout_correction(old, rollout, MASK, rollout_correction_of(settings)[0])
    want = aggregate_loss(apply_rollout_correction(per_token, result), MASK, "seq-mean-token-mean")
    assert 0 < stats["rollout_corr/rejected_fraction"] < 1  # the case exercises rejection
    assert loss.item() == pytest.approx(want.item(), rel=1e-6, abs=1e-7)
    (grad,), (want_grad,) = torch.autograd.grad(loss, lp), torch.autograd.grad(want, want_lp)
    assert torch.allclose(grad, want_grad, atol=1e-6)


def test_missing_column_is_a_named_error():
    with pytest.raises(ValueError, match="the actor batch has no 'rollout_log_probs' column"):
        run("ray_grpo", correction_settings(rollout_is="token"), batch(with_column=False))
