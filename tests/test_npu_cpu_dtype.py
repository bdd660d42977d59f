"""The CPU target's training dtype rule (rlhf_ext.npu.cpu_dtype), by hand; the same rule applied to
OpenRLHF's own loader, DeepSpeed configs and vLLM arguments is in tests/test_retarget_cpu_target.py."""

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf_ext.npu.cpu_dtype import ENV_CPU_DTYPE, cpu_dtype_setting, cpu_train_dtype, native_bf16

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("setting, asked, native, expected", [
    ("auto", "bf16", True, "bf16"),    # AVX-512-BF16 / AMX: the recipe's bf16 is kept
    ("auto", "bf16", False, "fp32"),   # AVX2-only: bf16 would be emulated, ~8x slower
    ("auto", "fp16", True, "fp32"),    # fp16 is emulated on these CPUs either way
    ("auto", "fp16", False, "fp32"),
    ("asked", "bf16", False, "bf16"),
    ("asked", "fp16", True, "fp16"),
    ("fp32", "bf16", True, "fp32"),
    ("fp32", "fp16", False, "fp32"),
    ("", "bf16", False, "fp32"),       # unset means auto
])  # fmt: skip
def test_the_rule(setting, asked, native, expected):
    assert cpu_train_dtype(asked, environ={ENV_CPU_DTYPE: setting}, native=native) == expected


def test_setting_is_validated_and_case_insensitive():
    assert cpu_dtype_setting({ENV_CPU_DTYPE: " FP32 "}) == "fp32"
    assert cpu_dtype_setting({}) == "auto"
    with pytest.raises(ValueError, match="RLHF_EXT_CPU_DTYPE='bf32' is not one of auto, asked, fp32"):
        cpu_train_dtype("bf16", environ={ENV_CPU_DTYPE: "bf32"}, native=True)


def test_native_bf16_follows_torchs_probes():
    import torch

    if platform.machine().lower() not in ("x86_64", "amd64"):
        assert native_bf16() is False
        return
    assert native_bf16() == (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


# AVX2, AVX-512 and AMX are x86 instruction sets: on an ARM host there is no AVX2-only CPU to present
X86_ONLY = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                              reason=f"scripts/avx2_only presents an x86 CPU as AVX2-only; this is {platform.machine()}")


def _printed_as_avx2_only(code):
    """What ``python -c code`` prints under scripts/avx2_only/run.sh (torch's probes answer as an AVX2-only
    CPU, the EPYC of issue 28), split into words."""
    out = subprocess.run(["bash", str(REPO / "scripts" / "avx2_only" / "run.sh"), sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@X86_ONLY
def test_an_avx2_only_cpu_trains_in_float32():
    code = "from rlhf_ext.npu.cpu_dtype import native_bf16, cpu_train_dtype; print(native_bf16(), cpu_train_dtype('bf16'))"
    assert _printed_as_avx2_only(code) == ["False", "fp32"]


@X86_ONLY
def test_the_avx2_emulation_leaves_interpreters_without_torch_alone():
    # Ray's helpers, pip and the grading workers never import torch; importing it for them would make the
    # emulated machine far slower than a real AVX2 one (docs/smoke.md, session 9)
    code = ("import sys; print('torch' in sys.modules); import torch; "
            "c = torch.cpu; print(c._is_avx512_supported(), c._is_avx512_bf16_supported(), c._is_amx_tile_supported())")
    assert _printed_as_avx2_only(code) == ["False", "False", "False", "False"]
