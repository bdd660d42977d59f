"""MFU: PaLM's FLOPs-per-token count by hand on a tiny config, the peak table, the record's compute
block on a real tiny model directory, per-step MFU in the writer and the report's run table."""

from __future__ import annotations

import json

import pytest

from rlhf_ext import runs
from rlhf_ext.runs import flops
from rlhf_ext.patches.openrlhf import run_record as rr
from rlhf_ext.runs.flops import compute_block
from rlhf_ext.runs.throughput import PREFIX, step_throughput

TINY = {"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2,
        "num_key_value_heads": 1, "intermediate_size": 16, "vocab_size": 32}


def test_flops_per_token_by_hand():
    shape = flops.shape_from_config(TINY)
    assert shape.head_dim == 4 and shape.gated_mlp
    # per layer: q 8x8, k 8x4, v 8x4, o 8x8 = 192; SwiGLU 3 x 8 x 16 = 384; two layers 1152; head 8 x 32 = 256
    assert shape.matmul_params == 1408
    # 6 N + 12 L H Q T at T = 10: 8448 + 12 * 2 * 2 * 4 * 10 = 8448 + 1920
    assert shape.train_flops_per_token(10) == 10368
    coeffs = shape.to_json()  # what the record stores: 6N and 12LHQ
    assert (coeffs["flops_per_token_fixed"], coeffs["flops_per_token_per_position"]) == (8448, 192)
    gpt2 = flops.shape_from_config({"model_type": "gpt2", "n_layer": 1, "n_embd": 4, "n_head": 2, "vocab_size": 10})
    # plain MLP of 4 x hidden: 2 x 4 x 16 = 128; attention 4 x 4 x 4 = 64; head 40
    assert (gpt2.gated_mlp, gpt2.intermediate, gpt2.matmul_params) == (False, 16, 232)
    with pytest.raises(ValueError, match="vocab_size"):
        flops.shape_from_config({k: v for k, v in TINY.items() if k != "vocab_size"})


def test_peak_table_matches_names_as_torch_gives_them_and_refuses_unknown_devices():
    assert flops.device_peak("NVIDIA H100 80GB HBM3")[0] == 989e12
    assert flops.device_peak("NVIDIA H100 PCIe")[0] == 756e12
    assert flops.device_peak("NVIDIA H200")[0] == 989e12 and flops.device_peak("NVIDIA H20")[0] == 148e12
    assert flops.device_peak("NVIDIA A100-SXM4-80GB")[0] == 312e12
    assert flops.device_peak("NVIDIA L40S")[0] == 362.05e12 and flops.device_peak("NVIDIA L4")[0] == 121e12
    peak, source = flops.device_peak("Ascend910B2")
    assert peak == 354e12 and "verl" in source
    for name in ("cpu", "Tesla V100-SXM2-32GB", None):
        peak, why = flops.device_peak(name)
        assert peak is None and why and ("no peak-FLOPs figure" in why or "names no device" in why)


def test_step_mfu_by_hand_and_no_mfu_without_a_peak():
    shape = flops.shape_from_config(TINY).to_json()
    compute = {"model_shape": shape, "peak_flops_per_device": 1e6, "device_count": 2, "updates_per_step": 2}
    values = {"rollout/num_samples": 4, "total_length": 10.0, "timing/ppo_train": 0.5, "timing/step_total": 1.0}
    out = step_throughput(values, compute)
    # 2 epochs x 4 samples x 10 tokens x 10368 FLOPs = 829,440; / (0.5 s x 1e6 x 2)
    assert out[PREFIX + "update_flops"] == 829440
    assert out[PREFIX + "mfu"] == pytest.approx(0.82944)
    no_peak = step_throughput(values, {**compute, "peak_flops_per_device": None})
    assert PREFIX + "mfu" not in no_peak and no_peak[PREFIX + "update_flops"] == 829440
    assert PREFIX + "mfu" not in step_throughput(values, None)


def test_compute_block_reads_a_real_model_dir_and_says_why_there_is_no_mfu(tmp_path):
    from rlhf_ext.evalkit.tiny_model import build_tiny_model

    model = tmp_path / "model"
    build_tiny_model(model)
    config = json.loads((model / "config.json").read_text())
    block = compute_block(str(model), 2, 1, device="NVIDIA H200")
    assert block["mfu_unavailable"] is None and block["peak_flops_per_device"] == 989e12
    assert block["model_shape"]["layers"] == config["num_hidden_layers"]
    assert block["model_shape"]["matmul_params"] == flops.shape_from_config(config).matmul_params
    cpu = compute_block(str(model), 1, 1, device="cpu")
    assert cpu["peak_flops_per_device"] is None and "no peak-FLOPs figure for device 'cpu'" in cpu["mfu_unavailable"]
    missing = compute_block(str(tmp_path / "nowhere"), 1, 1, device="NVIDIA H200")
    assert missing["model_shape"] is None and "no readable config" in missing["mfu_unavailable"]
    json.dumps(block, allow_nan=False)


def test_the_writer_records_mfu_from_the_config_compute_block(tmp_path):
    shape = flops.shape_from_config(TINY).to_json()
    runs.write_json_atomic(tmp_path / runs.CONFIG, {"started_at": 1.0, "compute": {
        "device": "x", "model_shape": shape, "peak_flops_per_device": 1e6, "device_count": 1, "updates_per_step": 1}})
    writer = rr.RunWriter(tmp_path)
    writer.begin(0)
    writer.write_step(1, {"rollout/num_samples": 1, "total_length": 10.0, "timing/ppo_train": 1.0,
                          "timing/step_total": 2.0})
    (rec,) = runs.read_metrics(tmp_path / runs.METRICS)
    assert rec[PREFIX + "update_flops"] == 103680 and rec[PREFIX + "mfu"] == pytest.approx(0.10368)


def test_report_run_table_mfu_by_hand_on_real_tiny_runs_and_the_reason_when_there_is_none(tmp_path):
    import shutil
    from pathlib import Path

    from rlhf_ext.report import load_runs
    from rlhf_ext.report.throughput_table import throughput_rows

    tiny = Path(__file__).resolve().parent / "data" / "report_tiny" / "runs"
    for name in ("grpo", "dr_grpo"):
        shutil.copytree(tiny / name, tmp_path / name)
    config = json.loads((tmp_path / "grpo" / runs.CONFIG).read_text())
    shape = flops.shape_from_config(TINY)
    config["compute"] = {"device": "NVIDIA H200", "device_count": 2, "peak_flops_per_device": 989e12,
                         "peak_source": "test", "model_shape": shape.to_json(), "updates_per_step": 1,
                         "mfu_unavailable": None}
    runs.write_json_atomic(tmp_path / "grpo" / runs.CONFIG, config)
    rows = throughput_rows(load_runs([tmp_path / "grpo", tmp_path / "dr_grpo"]))
    recs = runs.read_metrics(tmp_path / "grpo" / runs.METRICS)
    work = sum(r["rollout/num_samples"] * r["train/total_length"] * shape.train_flops_per_token(r["train/total_length"])
               for r in recs)
    assert rows[0].mfu == pytest.approx(work / (sum(r["timing/ppo_train"] for r in recs) * 989e12 * 2))
    assert rows[1].mfu is None and "no compute block" in rows[1].mfu_note
    from rlhf_ext.report import write_report

    page = write_report([tmp_path / "grpo", tmp_path / "dr_grpo"], tmp_path / "r.html").read_text()
    table = page[page.index("<table id=throughput-table>"):]
    table = table[:table.index("</table>")]
    cells = table.split('class="num mfu"')[1:]
    assert f">{100 * rows[0].mfu:.3g}%;" in cells[0] and "NVIDIA H200 x 2" in cells[0]
    assert "\u2014" in cells[1] and "the run record has no compute block" in cells[1]
    config["compute"].update(peak_flops_per_device=None, mfu_unavailable="no peak-FLOPs figure for device 'cpu'")
    runs.write_json_atomic(tmp_path / "grpo" / runs.CONFIG, config)
    (row, _) = throughput_rows(load_runs([tmp_path / "grpo", tmp_path / "dr_grpo"]))
    assert row.mfu is None and row.mfu_note == "no peak-FLOPs figure for device 'cpu'"
