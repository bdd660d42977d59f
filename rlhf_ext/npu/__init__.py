"""Device detection and the ``transfer_to_npu`` shim, so one recipe runs on Ascend NPUs, CUDA GPUs or CPU.

Not yet implemented: this package will hold ``detect_backend()``, device helpers and ``transfer_to_npu()``.
"""
