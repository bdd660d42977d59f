"""The OpenRLHF reward file, driven by OpenRLHF 0.11.2's own loader and thread offload
(``SingleTurnAgentExecutor``), with queries decoded the way OpenRLHF decodes them, its output fed
back into OpenRLHF's experience code, inside a real Ray actor, and never raising."""

import asyncio
import os
import subprocess
import sys

import pytest

from rlhf_ext.rewards import openrlhf_protocol
from rlhf_ext.rewards.openrlhf_protocol import DEFAULT_EOS_TOKENS, RewardScorer, recover_response
from rlhf_ext.rewards.config import RewardConfig
from rlhf_ext.rewards.path import resolve_remote_url, reward_file_path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CORPUS = [
    "Please reason step by step, and put your final answer within \\boxed{}.",
    "The answer is \\boxed{42}. So the final answer is 7 and #### 18.",
    "Janet sells 16 - 3 - 4 = 9 duck eggs a day. She makes 9 * 2 = 18 dollars.",
    "<think>\nLet me think.\n</think>\n<answer>\n3\n</answer>",
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(CORPUS, trainer=trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  chat_template=CHAT_TEMPLATE)
    path = tmp_path_factory.mktemp("tok")
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


def openrlhf_query(tok, question, response, eos=True):
    """(query, prompt) exactly as OpenRLHF builds them: chat-templated prompt, vLLM's token ids
    (EOS id kept when generation stopped), decoded with skip_special_tokens=False."""
    prompt = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                     add_generation_prompt=True)
    prompt_ids = tok(text=prompt, add_special_tokens=False)["input_ids"]
    action_ids = tok(text=response, add_special_tokens=False)["input_ids"]
    if eos:
        action_ids = action_ids + [tok.eos_token_id]
    return tok.decode(prompt_ids + action_ids, skip_special_tokens=False), prompt


@pytest.fixture
def reward_env(monkeypatch):
    """Configure the reward file through the environment, with a fresh process-wide scorer."""
    def configure(**env):
        for key in ("RLHF_EXT_REWARD", "RLHF_EXT_REWARD_TIMEOUT", "RLHF_EXT_REWARD_WORKERS",
                    "RLHF_EXT_REWARD_OPTIONS", "RLHF_EXT_REWARD_EOS", "RLHF_EXT_REWARD_TOKENIZER"):
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        _drop_scorer()

    yield configure
    _drop_scorer()


def _drop_scorer():
    if openrlhf_protocol._env_scorer is not None:
        openrlhf_protocol._env_scorer.close()
    openrlhf_protocol._env_scorer = None


def _executor():
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    executor = SingleTurnAgentExecutor(remote_rm_url=reward_file_path())  # OpenRLHF's own loader
    assert executor.reward_func is not None and executor.reward_func.__name__ == "reward_func"
    return executor


def _score_like_openrlhf(executor, samples):
    """One reward_func call per sample, all at once, each from an asyncio.to_thread worker thread."""
    async def run():
        return await asyncio.gather(*[executor._fetch_rewards_via_func([q], [p], [l]) for q, p, l in samples])

    return [out[0] for out in asyncio.run(run())]


def test_reward_file_in_openrlhf_rollout_threads(tokenizer, reward_env):
    reward_env(RLHF_EXT_REWARD="math", RLHF_EXT_REWARD_WORKERS="2")
    executor = _executor()
    cases = [
        ("What is 2+2?", "We add. The answer is \\boxed{4}.", True, "4", 1.2),
        ("What is 2+2?", "We add. The answer is \\boxed{4}.", False, "4", 0.7),  # cut off at max tokens
        ("What is 2+2?", "I believe it is \\boxed{5}.", True, "4", 0.2),
        ("What is 2+2?", "Let me think and think and", False, "4", -0.5),
        ("Half of one?", "So we get $\\boxed{\\frac{1}{2}}$", True, "0.5", 1.2),
        ("Eggs?", "She makes 18 dollars.\n#### 18", True, "Janet sells...\n#### 18", 1.2),  # GSM8K gold
        ("AMC?", "\\boxed{27}", True, 27.0, 1.2),  # AMC gold, a float from the JSON file
        ("AIME?", "\\boxed{25}", True, "025", 1.2),
    ]
    samples = [openrlhf_query(tokenizer, q, r, eos) + (label,) for q, r, eos, label, _ in cases]
    assert samples[0][0].endswith("<|im_end|>") and not samples[1][0].endswith("<|im_end|>")
    results = _score_like_openrlhf(executor, samples * 3)  # 24 concurrent calls
    for (q, r, eos, label, expected), out in zip(cases * 3, results):
        assert set(out) == {"rewards", "scores", "extra_logs"}
        assert out["rewards"].shape == (1,) and out["rewards"].tolist() == [pytest.approx(expected)], (r, eos)
        assert out["scores"].tolist() == [1.0 if expected > 0.5 else 0.0]
        logs = out["extra_logs"]  # one sample a call: a float each (OpenRLHF makes the tensors)
        assert all(type(v) is float for v in logs.values())
        assert logs["reward_flag/truncated"] == (0.0 if eos else 1.0)
        assert logs["reward_flag/error"] == 0.0 and logs["reward_flag/prompt_not_found"] == 0.0
    keys = [sorted(out["extra_logs"]) for out in results]
    assert all(k == keys[0] for k in keys)  # OpenRLHF concatenates these per sample: same keys always
    assert {"reward/accuracy", "reward/answer_format", "reward/truncation", "reward_flag/no_answer",
            "reward_flag/timeout", "reward_flag/gold_unparsed"} <= set(keys[0])


CHOICE_LABEL = {"options": ["Paris", "London", "Rome", "Berlin"], "answer": "B"}
RANK_LABEL = {"answer_type": "ranking", "options": {"A": "one", "B": "two", "C": "three"}, "answer": ["C", "A", "B"]}


def test_choice_and_ranking_rewards_through_the_reward_file(tokenizer, reward_env):
    """Choice and ranking labels (as OpenRLHF passes them from the JSONL: an object, or its JSON text)
    scored by the reward file in OpenRLHF's rollout threads, next to a math label (issue 25)."""
    import json

    from rlhf_ext.rewards.openrlhf_reward import reward_func_calls

    spec = "choice_accuracy:1.0,ranking_partial:0.5,parse_failure:-0.5,format:0.1,truncation:-0.5"
    reward_env(RLHF_EXT_REWARD=spec, RLHF_EXT_REWARD_WORKERS="1")
    executor = _executor()
    cases = [  # question, response, eos, label, reward, score (exact correctness)
        ("Capital?", "London is the capital, so the answer is (B).", True, CHOICE_LABEL, 1.5, 1.0),
        ("Capital?", "\\boxed{B}", False, json.dumps(CHOICE_LABEL), 1.0, 1.0),  # cut off: -0.5
        ("Capital?", "Answer: A or B", True, CHOICE_LABEL, -0.5, 0.0),  # two picks: a parse failure
        ("Capital?", "Answer: E", True, CHOICE_LABEL, -0.5, 0.0),  # not an option
        ("Rank.", "Final ranking:\n1. C\n2. A\n3. B", True, RANK_LABEL, 1.5, 1.0),
        ("Rank.", "\\boxed{C > B > A}", True, RANK_LABEL, 1 + 0.5 * (1 / 3 + 0.5), 0.0),  # tau 1/3, top-1 right
        ("Rank.", "\\boxed{C > A}", True, RANK_LABEL, -0.5, 0.0),  # misses B
        ("2+2?", "The answer is \\boxed{4}.", True, "4", 1.5, 1.0),  # a math label in the same job
    ]
    samples = [openrlhf_query(tokenizer, q, r, eos) + (label,) for q, r, eos, label, _, _ in cases]
    results = _score_like_openrlhf(executor, samples * 2)
    for (q, r, eos, label, reward, score), out in zip(cases * 2, results):
        assert out["rewards"].tolist() == [pytest.approx(reward)], r
        assert out["scores"].tolist() == [score], r
        logs = out["extra_logs"]
        assert logs["reward_flag/error"] == 0.0 and logs["reward_flag/gold_unparsed"] == 0.0
        assert logs["reward_flag/truncated"] == (0.0 if eos else 1.0)
    keys = [sorted(out["extra_logs"]) for out in results]
    assert all(k == keys[0] for k in keys)
    assert {"reward/choice_accuracy", "reward/ranking_partial", "reward/parse_failure"} <= set(keys[0])
    # the plugin's batched path, with a batch-relative component (graded together, rewarded per call)
    reward_env(RLHF_EXT_REWARD="ranking_exact:1.0,length:0.1", RLHF_EXT_REWARD_WORKERS="1")
    outs = reward_func_calls([([q], [p], [lab]) for q, p, lab in samples[4:7]])
    assert [o["scores"].tolist() for o in outs] == [[1.0], [0.0], [0.0]]
    assert [o["rewards"].tolist() for o in outs] == [[1.0], [0.0], [0.0]]  # one sample per call: length is 0


def test_openrlhf_builds_experiences_from_the_rewards(tokenizer, reward_env):
    import torch
    from openrlhf.trainer.ppo_utils.experience import Experience, make_experience_batch, split_experience_batch
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    reward_env(RLHF_EXT_REWARD="accuracy:1.0,format:0.5,truncation:-0.5", RLHF_EXT_REWARD_WORKERS="1")
    executor = _executor()
    texts = [("<think>\nadd\n</think>\n<answer>\n\\boxed{4}\n</answer>", True, 1.5), ("\\boxed{5}", False, -0.5)]
    experiences = []
    for response, eos, expected in texts:
        query, prompt = openrlhf_query(tokenizer, "2+2?", response, eos)
        info = _score_like_openrlhf(executor, [(query, prompt, "4")])[0]
        prompt_ids = tokenizer(text=prompt, add_special_tokens=False)["input_ids"]
        action_ids = tokenizer(text=response, add_special_tokens=False)["input_ids"]
        output = {  # what SingleTurnAgentExecutor.execute() returns after its reward call
            "prompt": prompt, "label": "4", "images": None, "mm_train_inputs": None,
            "observation_tokens": prompt_ids + action_ids, "action_ranges": [(len(prompt_ids), len(prompt_ids) +
                                                                              len(action_ids))],
            "rollout_log_probs": None, "truncated": not eos,
            "reward": info["rewards"], "scores": info["scores"], "extra_logs": info["extra_logs"],
        }
        exp = SamplesGenerator._process_response_into_experience(None, output, max_len=512)
        assert all(type(v) is float for v in info["extra_logs"].values())
        # the logs as float tensors (what reward files conventionally return) build the same experience
        as_tensors = dict(output, extra_logs={k: torch.tensor([v], dtype=torch.float32)
                                              for k, v in info["extra_logs"].items()})
        same = SamplesGenerator._process_response_into_experience(None, as_tensors, max_len=512)
        assert list(exp.info) == list(same.info)
        for key in exp.info:
            assert exp.info[key].dtype == same.info[key].dtype and torch.equal(exp.info[key], same.info[key]), key
        assert exp.rewards.flatten().tolist() == [pytest.approx(expected)]
        assert exp.info["reward/format"].tolist() == [1.0 if eos else 0.0]
        experiences.append(exp)
    # The rollout path: per-sample experiences concatenated, split into items, re-batched.
    batch = Experience.concat_experiences(experiences, tokenizer.pad_token_id)
    assert torch.allclose(batch.rewards.flatten(), torch.tensor([1.5, -0.5]))
    assert batch.info["reward_flag/truncated"].flatten().tolist() == [0.0, 1.0]
    items = split_experience_batch(batch)  # raises if a sample lacked an extra_logs key
    assert len(items) == 2
    rebatched = make_experience_batch(items)
    assert [float(v) for v in rebatched.info["reward/accuracy"]] == [1.0, 0.0]


def test_reward_func_never_raises(tokenizer, reward_env):
    from rlhf_ext.rewards.openrlhf_reward import reward_func

    reward_env(RLHF_EXT_REWARD="acuracy")  # a typo: every call scores 0 and says why
    out = reward_func(["q"], ["q"], ["1"])
    assert out["rewards"].tolist() == [0.0] and out["extra_logs"]["reward_flag/error"] == 1.0

    reward_env(RLHF_EXT_REWARD="math", RLHF_EXT_REWARD_WORKERS="1")
    bad_inputs = [
        ([None], ["p"], ["1"]),  # a query that is not text
        (["a", "b"], ["a"], ["1", "2"]),  # mismatched list lengths
        (["q"], [None], ["1"]),
    ]
    for queries, prompts, labels in bad_inputs:
        out = reward_func(queries, prompts, labels)
        assert out["rewards"].tolist() == [0.0] * len(queries)
        flags = out["extra_logs"]["reward_flag/error"]  # a float for one sample, a tensor for more
        assert flags == 1.0 if len(queries) == 1 else flags.tolist() == [1.0] * len(queries)
    query, prompt = openrlhf_query(tokenizer, "2+2?", "\\boxed{4}")
    for label in (None, "", {"x": 1}, float("nan")):  # unusable golds are reported, not errors
        out = reward_func([query], [prompt], [label])
        logs = out["extra_logs"]
        assert out["scores"].tolist() == [0.0] and logs["reward_flag/gold_unparsed"] == 1.0
        assert logs["reward_flag/error"] == 0.0


def test_hostile_sample_in_rollout_threads_scores_zero_with_a_timeout_flag(tokenizer, reward_env):
    reward_env(RLHF_EXT_REWARD="math", RLHF_EXT_REWARD_TIMEOUT="2", RLHF_EXT_REWARD_WORKERS="2")
    executor = _executor()
    hostile = openrlhf_query(tokenizer, "Compute.", "\\boxed{9^{9^{9^{9}}}}") + ("1",)
    normal = [openrlhf_query(tokenizer, "Compute.", "\\boxed{%d}" % i) + (str(i),) for i in range(12)]
    results = _score_like_openrlhf(executor, [hostile] + normal)
    assert results[0]["extra_logs"]["reward_flag/timeout"] == 1.0
    assert results[0]["rewards"].tolist() == [pytest.approx(0.2)]  # formatted, but not credited
    assert all(r["scores"].tolist() == [1.0] for r in results[1:])


def test_response_recovery():
    prompt = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    r = recover_response(prompt + "\\boxed{1}<|im_end|><|endoftext|>", prompt)
    assert (r.text, r.truncated, r.prompt_found) == ("\\boxed{1}", False, True)
    r = recover_response(prompt + "\\boxed{1} and more", prompt)
    assert (r.text, r.truncated) == ("\\boxed{1} and more", True)
    # a prompt that did not decode back exactly (spaces normalized): found by its tail
    long_prompt = ("<|im_start|>system\nYou  are helpful.<|im_end|>\n<|im_start|>user\nWhat is the value of "
                   "2+2 written in base ten, please?<|im_end|>\n<|im_start|>assistant\n")
    decoded = long_prompt.replace("You  are", "You are")
    r = recover_response(decoded + "A<|im_end|>", long_prompt)
    assert (r.text, r.prompt_found) == ("A", True)
    # a prompt truncated on the left by OpenRLHF to fit max_len
    r = recover_response(long_prompt[30:] + "B</s>", long_prompt)
    assert (r.text, r.truncated, r.prompt_found) == ("B", False, True)
    # no trace of the prompt: fall back to the assistant marker, and say so
    r = recover_response("junk<|im_start|>assistant\nC<|im_end|>", "something else entirely")
    assert (r.text, r.truncated, r.prompt_found) == ("C", False, False)
    # configured end-of-sequence strings
    r = recover_response("P" + "D[END]", "P", eos_tokens=("[END]",))
    assert (r.text, r.truncated) == ("D", False)
    assert "<|im_end|>" in DEFAULT_EOS_TOKENS and "<|eot_id|>" in DEFAULT_EOS_TOKENS


def test_tokenizer_config_gives_eos_and_token_lengths(tokenizer, tokenizer_dir):
    scorer = RewardScorer(RewardConfig(reward="soft_overlong_punishment",
                                       options={"soft_overlong_punishment": {"max_completion_len": 8,
                                                                             "soft_punish_cache": 4}},
                                       tokenizer=tokenizer_dir))
    try:
        response = "Janet sells 16 - 3 - 4 = 9 duck eggs"
        n_tokens = len(tokenizer(text=response, add_special_tokens=False)["input_ids"])
        assert n_tokens > 8 and len(response) > n_tokens  # tokens, not characters, are measured
        query, prompt = openrlhf_query(tokenizer, "eggs?", response)
        out = scorer.score([query], [prompt], ["9"])
        assert out["rewards"] == [-1.0] and out["extra_logs"]["reward_flag/truncated"] == [0.0]
        short_query, short_prompt = openrlhf_query(tokenizer, "eggs?", "9")
        assert scorer.score([short_query], [short_prompt], ["9"])["rewards"] == [0.0]
    finally:
        scorer.close()


def test_reward_file_path_and_short_form():
    path = reward_file_path()
    assert os.path.isfile(path) and path.endswith(os.path.join("rlhf_ext", "rewards", "openrlhf_reward.py"))
    out = subprocess.run([sys.executable, "-m", "rlhf_ext.rewards.path"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == path and "Warning" not in out.stderr
    cli = os.path.join(os.path.dirname(sys.executable), "rlhf-ext")
    out = subprocess.run([cli, "reward-file"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == path
    assert resolve_remote_url("rlhf_ext:math") == (path, {"RLHF_EXT_REWARD": "math"})
    assert resolve_remote_url("rlhf_ext:accuracy:1.0,format:0.2") == (path, {"RLHF_EXT_REWARD": "accuracy:1.0,format:0.2"})
    assert resolve_remote_url("rlhf_ext") == (path, {})
    assert resolve_remote_url("http://rm:5000/get_reward") == ("http://rm:5000/get_reward", {})
    with pytest.raises(ValueError, match="unknown reward 'acc'"):
        resolve_remote_url("rlhf_ext:acc")
    with pytest.raises(ValueError, match="name a reward"):
        resolve_remote_url("rlhf_ext:")


def test_one_reader_of_the_reward_short_form():
    """OpenRLHF's --reward.remote_url and MindSpeed-RL's verifier_function read ``rlhf_ext:`` the same way."""
    from rlhf_ext.patches.mindspeed_rl.config import ConfigError, check_verifiers
    from rlhf_ext.rewards.path import is_short_form, short_form_spec

    assert short_form_spec("rlhf_ext:accuracy:1.0, format:0.2 ") == "accuracy:1.0, format:0.2"
    assert short_form_spec("rlhf_ext:") == ""
    for other in ("rlhf_ext", "acc", "http://rm/rlhf_ext:math", None, 3):
        assert short_form_spec(other) is None
    assert is_short_form("rlhf_ext") and is_short_form("rlhf_ext:math") and not is_short_form("acc")
    assert check_verifiers(["acc", "rlhf_ext:math", "rlhf_ext:accuracy:1.0,format:0.2"], [1, 1, 1]) == [
        "math", "accuracy:1.0,format:0.2"]
    for bad in ("rlhf_ext:", "rlhf_ext", "rlhf_ext:acc"):
        with pytest.raises(ConfigError, match=repr(bad)):
            check_verifiers([bad], [1])


@pytest.mark.filterwarnings("ignore::FutureWarning")  # Ray's own notice about accelerator env vars
def test_reward_file_inside_a_ray_actor(tokenizer):
    import ray

    samples = [openrlhf_query(tokenizer, "2+2?", "\\boxed{4}") + ("4",),
               openrlhf_query(tokenizer, "2+2?", "\\boxed{5}", eos=False) + ("4",)]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"RLHF_EXT_REWARD": "math", "RLHF_EXT_REWARD_WORKERS": "1"}})
    try:
        @ray.remote(num_cpus=1)
        class RolloutLike:
            """Loads the reward file the way OpenRLHF's rollout actor does and scores from threads."""

            def __init__(self, path):
                import importlib.util

                # openrlhf/utils/agent.py's loader, without importing all of OpenRLHF into the actor
                spec = importlib.util.spec_from_file_location("reward_func", path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                self.reward_func = module.reward_func

            def score(self, batch):
                async def run():  # one asyncio.to_thread call per sample, as in _fetch_rewards_via_func
                    return await asyncio.gather(*[asyncio.to_thread(self.reward_func, [q], [p], [l])
                                                  for q, p, l in batch])

                return [(o["rewards"].tolist(), o["extra_logs"]["reward_flag/truncated"], os.getpid())
                        for o in asyncio.run(run())]

        actor = RolloutLike.remote(reward_file_path())
        out = ray.get(actor.score.remote(samples), timeout=180)
        assert [o[0] for o in out] == [[pytest.approx(1.2)], [pytest.approx(-0.3)]]
        assert [o[1] for o in out] == [0.0, 1.0]  # one sample a call: a float
        assert out[0][2] != os.getpid()  # really scored in another process
    finally:
        ray.shutdown()
