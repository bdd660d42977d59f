"""Tests of rlhf_ext inside the real MindSpeed-RL 2.1.0 (source snapshot + stand-ins for Ascend).

They run in the MindSpeed-RL environment (``.venv-mindspeed``: transformers 4.57), started by
``tests/test_mindspeed_rl_suite.py`` from the main suite with ``RLHF_EXT_MINDSPEED_SUITE=1``,
MindSpeed-RL's checkout and ``tests/mindspeed_standin`` on ``PYTHONPATH``. Collected only then:
the main environment cannot import MindSpeed-RL.
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
STANDIN = os.path.join(REPO, "tests", "mindspeed_standin")

if os.environ.get("RLHF_EXT_MINDSPEED_SUITE") != "1":
    collect_ignore_glob = ["*"]
else:
    sys.path.insert(0, HERE)


def mindspeed_src() -> str:
    return os.environ["RLHF_EXT_MINDSPEED_RL_SRC"]


@pytest.fixture(scope="session", autouse=True)
def plugin_active():
    """The plugin as users activate it: RLHF_EXT_PLUGINS=rlhf_ext, inherited by every Ray worker."""
    os.environ["RLHF_EXT_PLUGINS"] = "rlhf_ext"
    from rlhf_ext.patches import activate

    activate()
    import mindspeed_rl  # noqa: F401  (imports every patched module, applying the patches)

    yield


@pytest.fixture(scope="session")
def local_ray(plugin_active):
    """One local Ray for every test that needs it (workers inherit PYTHONPATH and RLHF_EXT_PLUGINS)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True,
             runtime_env={"env_vars": {"RLHF_EXT_QUIET": "0"}})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """A character-level tokenizer built here (no model hub): decodes exactly what it encodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set("".join(chr(c) for c in range(32, 127)) + "\n"))
    vocab = {"<pad>": 0, "<eos>": 1}
    vocab.update({c: i + 2 for i, c in enumerate(chars)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
