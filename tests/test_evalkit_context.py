"""A run longer than the model's context is refused before any engine loads, with fixes that exist
(issue 41, item 7). The context is derived from the config as vLLM 0.32 derives it; the tiny Qwen2 of
evalkit stands in for a 512-token model."""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlhf_ext.evalkit.context import ModelContext, check_prompts_fit, context_refusal, model_context
from rlhf_ext.evalkit.tasks import load_task
from rlhf_ext.evalkit.templates import render_prompt
from rlhf_ext.evalkit.tiny_model import build_tiny_model

AIME = Path("../shared/data/aime24.jsonl").resolve()


@pytest.fixture(scope="module")
def model_512(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("ctx") / "tiny-512", seed=0, max_position_embeddings=512)


def _variant(model: Path, tmp_path: Path, name: str, **config) -> Path:
    """A copy of ``model``'s config and tokenizer with ``config`` merged in (None deletes a key)."""
    out = tmp_path / name
    out.mkdir()
    for f in model.iterdir():
        if f.suffix in (".json", ".jinja") and f.name != "config.json":
            shutil.copy(f, out / f.name)
    cfg = json.loads((model / "config.json").read_text())
    for k, v in config.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_aime24_on_a_512_token_model_is_refused_before_vllm_is_imported(model_512, tmp_path):
    tok = __import__("transformers").AutoTokenizer.from_pretrained(model_512)
    longest = max(len(render_prompt(p.text, "r1", tok).token_ids) for p in load_task("aime24", AIME).problems)
    assert longest > 512  # the premise: AIME prompts alone exceed this model's context
    out = tmp_path / "run"
    argv = ["aime24", "--model", str(model_512), "--data", str(AIME), "--output", str(out)]
    # a fresh interpreter, so that "vllm not imported" speaks of this call alone
    code = ("import json, sys, time; from rlhf_ext.evalkit.cli import main; t = time.monotonic(); "
            "rc = main(json.loads(sys.argv[1])); print('seconds:', time.monotonic() - t); "
            "print('vllm imported:', 'vllm' in sys.modules); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(argv)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr
    assert (f"the longest prompt ({longest} tokens) alone exceeds the context of 512 tokens "
            "(max_position_embeddings=512 in its config.json)") in err, err
    assert "30 of 30 problems do not fit" in err and "Refused before starting the engine" in err
    assert f"a model whose context holds at least {longest + 32768} tokens" in err
    # only fixes that exist: no room for any --max-tokens, and the model allows no longer --max-model-len
    assert "--max-tokens -" not in err and "Fixes: --max-tokens" not in err and "--max-model-len" not in err
    assert "vllm imported: False" in proc.stdout
    assert not out.exists()  # nothing written
    seconds = float(proc.stdout.split("seconds:")[1].split()[0])
    assert seconds < 30, seconds  # tokenizer load + 30 prompts; an engine start alone costs ~30 s here


def test_the_check_itself_is_fast_and_names_the_fixes_that_exist(model_512, tmp_path):
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as info:
        check_prompts_fit(str(model_512), [300, 100, 450], max_tokens=128)
    assert time.perf_counter() - t0 < 1.0  # reads two small JSON files
    msg = str(info.value)
    assert "the longest prompt (450 tokens) plus --max-tokens 128 exceeds the context of 512 tokens" in msg
    assert "1 of 3 problems do not fit" in msg  # 300 + 128 fits, 450 + 128 does not
    assert "--max-tokens 62 (longer responses are then cut at 62 tokens)" in msg
    assert "--max-model-len" not in msg  # the model allows no more than 512
    assert "leave out the 1 problem(s)" in msg and "at least 578 tokens" in msg
    check_prompts_fit(str(model_512), [300, 100, 450], max_tokens=62)  # the suggested fix fits


def test_max_model_len_is_suggested_only_up_to_what_the_model_allows(model_512, tmp_path):
    # --max-model-len below the model's 512: raising it is a real fix
    msg = context_refusal([200], 200, model_context(str(model_512), max_model_len=300))
    assert "the context of 300 tokens" in msg and "--max-model-len 400 (or leave it out: the model allows 512)" in msg
    assert "--max-tokens 100" in msg
    # needs more than the model allows: raise to its maximum and shorten the responses
    msg = context_refusal([200], 400, model_context(str(model_512), max_model_len=300))
    assert "--max-model-len 512 --max-tokens 312" in msg
    # an engine already loaded cannot change its length
    msg = context_refusal([200], 400, ModelContext(300, 300, "", fixed=True))
    assert "--max-model-len" not in msg and "Refused before" not in msg
    with pytest.raises(ValueError, match="--max-model-len 1024 exceeds the context of --model .*: 512 tokens"):
        model_context(str(model_512), max_model_len=1024)


def _variants(model_512, tmp_path):
    return {
        "plain": model_512,
        # linear RoPE scaling multiplies the context; YaRN's max_position_embeddings already counts it
        "linear": _variant(model_512, tmp_path, "linear",
                           rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}),
        "yarn": _variant(model_512, tmp_path, "yarn", rope_parameters={
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "rope_theta": 10000.0}),
        # a config's own model_max_length wins over max_position_embeddings (Command-R)
        "mml": _variant(model_512, tmp_path, "mml", model_max_length=384),
    }


def test_context_is_derived_as_vllm_derives_it(model_512, tmp_path):
    models = _variants(model_512, tmp_path)
    ctx = model_context(str(models["linear"]))
    assert (ctx.limit, ctx.model_max) == (2048, 2048) and "RoPE scaling factor 4" in ctx.source
    assert "--max-model-len 1200" in context_refusal([1000], 200, model_context(str(models["linear"]), 1024))
    assert model_context(str(models["yarn"])).limit == 512
    assert model_context(str(models["mml"])).limit == 384
    assert context_refusal([100, 200], 300, model_context(str(model_512))) is None
    # the same numbers from vLLM's own ModelConfig (a fresh interpreter: importing vLLM costs ~10 s, no engine)
    code = ("import json, sys; from vllm.config import ModelConfig; "
            "print(json.dumps({k: ModelConfig(model=v).max_model_len for k, v in json.loads(sys.argv[1]).items()}))")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps({k: str(v) for k, v in models.items()})],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    vllm_lens = json.loads(proc.stdout.strip().splitlines()[-1])
    assert vllm_lens == {k: model_context(str(v)).limit for k, v in models.items()} == \
        {"plain": 512, "linear": 2048, "yarn": 512, "mml": 384}
