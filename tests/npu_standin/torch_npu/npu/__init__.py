"""Stand-in ``torch.npu`` (tests only): the API of torch_npu.npu, running on the host, recording calls."""

import os
from types import SimpleNamespace

import torch

from torch_npu.standin import record

_state = {"device": 0}


def device_count():
    visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    return int(os.environ.get("STANDIN_NPU_COUNT", "8"))


def is_available():
    return device_count() > 0


def current_device():
    record("current_device")
    return _state["device"]


def set_device(device):
    record("set_device", device)
    if isinstance(device, str):
        device = torch.device(device.replace("npu", "cpu")).index or 0
    elif isinstance(device, torch.device):
        device = device.index or 0
    _state["device"] = int(device)


def synchronize(device=None):
    record("synchronize", device)


def empty_cache():
    record("empty_cache")


class Stream:
    """A stream on the host: ``npu_stream`` is what vllm-ascend hands to HCCL."""

    def __init__(self, device=None, priority=0, **kwargs):
        self.device = device
        self.npu_stream = 0

    def synchronize(self):
        record("stream.synchronize")

    def wait_stream(self, other):
        record("stream.wait_stream")


class Event:
    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None):
        record("event.record")

    def synchronize(self):
        pass


def current_stream(device=None):
    record("current_stream", device)
    return Stream(device)


def default_stream(device=None):
    record("default_stream", device)
    return Stream(device)


class stream:
    def __init__(self, s=None):
        self.s = s

    def __enter__(self):
        return self.s

    def __exit__(self, *exc):
        return False


class device:
    def __init__(self, index):
        self.index = index

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def get_device_properties(device=None):
    record("get_device_properties", device)
    return SimpleNamespace(name="Ascend910B-standin", total_memory=64 * 2**30, multi_processor_count=24)


def get_device_name(device=None):
    return "Ascend910B-standin"


def get_device_capability(device=None):
    # torch_npu/npu/utils.py: "Cann does not have a corresponding concept ... returns None"
    record("get_device_capability", device)
    return None


def mem_get_info(device=None):
    return (32 * 2**30, 64 * 2**30)


def memory_allocated(device=None):
    return 0


max_memory_allocated = memory_reserved = max_memory_reserved = memory_allocated


def reset_peak_memory_stats(device=None):
    record("reset_peak_memory_stats")


reset_max_memory_allocated = reset_peak_memory_stats


def memory_stats(device=None):
    return {}


def manual_seed(seed):
    record("manual_seed", seed)


manual_seed_all = manual_seed


def is_bf16_supported():
    return True
