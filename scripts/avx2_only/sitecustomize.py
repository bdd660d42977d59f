"""Make this process (and every child that inherits PYTHONPATH) see an AVX2-only x86 CPU.

CI runs on machines of one kind whose CPUs range from AVX2-only (AMD EPYC without AVX-512) to
AMX. A machine with AVX-512/AMX can reproduce the AVX2-only code paths with
``scripts/avx2_only/run.sh CMD...``, which sets ``ATEN_CPU_CAPABILITY=avx2`` (torch's own kernels),
``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN's JIT) and puts this directory on ``PYTHONPATH``, so that
the feature probes torch exposes, which vLLM and DeepSpeed read to pick kernels, answer as an
AVX2-only CPU would. What it cannot change: the instructions the host's own libraries were built
to use outside these probes, and the speed of bf16 arithmetic emulated in software on a real
AVX2 core (the two are close only for oneDNN and ATen, which honour the variables above).

The probes are patched when ``torch.cpu`` is imported, not by importing torch here: Ray, pip and the
grading workers start many interpreters that never import torch, and importing it in each of them
(~300 MB and seconds of CPU apiece) would make the emulated machine much slower than a real one.
"""

import importlib.abc
import importlib.machinery
import os
import sys

_PROBES = ("_is_avx512_supported", "_is_avx512_vnni_supported", "_is_avx512_bf16_supported",
           "_is_amx_tile_supported", "_is_amx_fp16_supported", "_is_vnni_supported")


def _present_avx2_only(cpu_module):
    for probe in _PROBES:
        if hasattr(cpu_module, probe):
            setattr(cpu_module, probe, lambda: False)
    if hasattr(cpu_module, "_init_amx"):
        cpu_module._init_amx = lambda: False


class _PatchAfterExec(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _present_avx2_only(module)

    def __getattr__(self, name):  # get_source, is_package, resources: the wrapped loader's own
        return getattr(self._loader, name)


class _TorchCpuFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch.cpu":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchAfterExec(spec.loader)
        return spec


if os.environ.get("RLHF_EXT_AVX2_ONLY") == "1":
    if "torch.cpu" in sys.modules:  # imported before site ran (not the usual case): patch it now
        _present_avx2_only(sys.modules["torch.cpu"])
    else:
        sys.meta_path.insert(0, _TorchCpuFinder())
