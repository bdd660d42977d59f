"""Make this process (and every child that inherits PYTHONPATH) see an AVX2-only x86 CPU.

CI runs on machines of one kind whose CPUs range from AVX2-only (AMD EPYC without AVX-512) to
AMX. A machine with AVX-512/AMX can reproduce the AVX2-only code paths with
``scripts/avx2_only/run.sh CMD...``, which sets ``ATEN_CPU_CAPABILITY=avx2`` (torch's own kernels),
``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN's JIT) and puts this directory on ``PYTHONPATH``, so that
the feature probes torch exposes, which vLLM and DeepSpeed read to pick kernels, answer as an
AVX2-only CPU would. What it cannot change: the instructions the host's own libraries were built
to use outside these probes, and the speed of bf16 arithmetic emulated in software on a real
AVX2 core (the two are close only for oneDNN and ATen, which honour the variables above).
"""

import os

if os.environ.get("RLHF_EXT_AVX2_ONLY") == "1":
    try:
        import torch.cpu as _cpu

        for _probe in ("_is_avx512_supported", "_is_avx512_vnni_supported", "_is_avx512_bf16_supported",
                       "_is_amx_tile_supported", "_is_amx_fp16_supported", "_is_vnni_supported"):
            if hasattr(_cpu, _probe):
                setattr(_cpu, _probe, lambda: False)
        if hasattr(_cpu, "_init_amx"):
            _cpu._init_amx = lambda: False
    except Exception:  # no torch in this interpreter: nothing to present
        pass
