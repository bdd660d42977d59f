"""Auto-generated stand-ins for the Ascend / Megatron stack MindSpeed-RL imports (tests only).

MindSpeed-RL's package ``__init__`` imports everything, including hundreds of names from
``megatron``, ``mindspeed``, ``mindspeed_llm``, ``vllm``, ``vllm_ascend``, ``acl`` and
``torchvision`` that only exist on an Ascend machine. The packages beside this file make those
imports succeed: each one is a plain ``types.ModuleType`` (Ray pickles functions that refer to
them by reference, so they must be real modules found again by name in every worker), every
submodule is created on demand, and every attribute nobody defined is a stand-in class.

A stand-in class can be subclassed, instantiated with any arguments, called, and asked for any
attribute (which is another stand-in class), so module-level code such as
``class X(MegatronModule)`` or ``@parse_args_decorator`` runs. Nothing here computes anything:
a test that reaches Megatron's training code fails loudly (calling a stand-in's method returns a
stand-in instance, never a number), and those tests are not part of what rlhf_ext runs.
"""

import importlib.abc
import importlib.machinery
import sys
import types

STANDIN_ROOTS = ("torch_npu", "vllm", "vllm_ascend", "mindspeed", "mindspeed_llm", "megatron", "acl", "torchvision")


class _StandInMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        child = _make_class(name, cls.__module__, f"{cls.__qualname__}.{name}")
        setattr(cls, name, child)
        return child

    def __iter__(cls):
        return iter(())

    def __bool__(cls):
        return True


class StandIn(metaclass=_StandInMeta):
    """Accepts any construction; any attribute is another stand-in; calling returns a stand-in."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # used as a decorator: keep the decorated function
        return StandIn()

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(type(self), name)


def _make_class(name, module, qualname=None):
    cls = _StandInMeta(name, (StandIn,), {"__module__": module, "__qualname__": qualname or name})
    return cls


def _module_getattr(module_name):
    def __getattr__(name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        module = sys.modules[module_name]
        value = _make_class(name, module_name)
        setattr(module, name, value)
        return value

    return __getattr__


def make_module(name, package=True):
    module = types.ModuleType(name)
    module.__file__ = f"<rlhf_ext stand-in {name}>"
    if package:
        module.__path__ = []
    module.__getattr__ = _module_getattr(name)
    return module


def add_auto_attributes(module):
    """Give a file-backed stand-in module the on-demand attributes and submodules."""
    module.__dict__.setdefault("__getattr__", _module_getattr(module.__name__))


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        return make_module(spec.name)

    def exec_module(self, module):
        parent, _, child = module.__name__.rpartition(".")
        if parent and parent in sys.modules:
            setattr(sys.modules[parent], child, module)


class _Finder(importlib.abc.MetaPathFinder):
    """Creates any submodule of a stand-in root that has no file of its own."""

    def find_spec(self, fullname, path=None, target=None):
        root = fullname.partition(".")[0]
        if root not in STANDIN_ROOTS or "." not in fullname:
            return None
        parent = sys.modules.get(fullname.rpartition(".")[0])
        if parent is None or not str(getattr(parent, "__file__", "")).startswith(("<rlhf_ext stand-in", _HERE)):
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)


import os  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
_finder = _Finder()


def install():
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_finder)
