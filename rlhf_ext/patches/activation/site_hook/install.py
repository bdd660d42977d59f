"""setuptools command that installs the start-up hook next to the package (used by setup.py only).

Both install paths put two files at the top of site-packages:

* ``pip install .`` builds a wheel: the files are written into ``build_lib``, the wheel's root;
* ``pip install -e .`` (PEP 660) builds an "editable" wheel whose root is the unpacked-wheel
  directory that setuptools hands to the ``install`` command; files in ``build_lib`` are ignored
  there, so they are written into that directory instead.

This module is run by setup.py with ``runpy`` (the package itself need not be importable while
it is being built), so it imports only setuptools and the standard library.
"""

import os

from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE_NAME = "rlhf_ext_startup"
PTH_NAME = "rlhf_ext_startup.pth"
# site executes .pth lines that start with "import". This one imports nothing unless a plugin may be
# requested: importing even an empty module costs every Python process of the environment ~1 ms,
# the substring test and the variable lookup cost microseconds. rlhf_ext_startup decides precisely.
PTH_LINE = (
    'import os, sys; (os.environ.get("RLHF_EXT_PLUGINS") or "--plugin" in str(sys.argv)) '
    'and __import__("rlhf_ext_startup")\n'
)


def _startup_files():
    with open(os.path.join(HERE, MODULE_NAME + ".py"), encoding="utf-8") as f:
        module_source = f.read()
    return {MODULE_NAME + ".py": module_source, PTH_NAME: PTH_LINE}


class BuildPyWithStartupHook(build_py):
    """``build_py`` that also ships ``rlhf_ext_startup.py`` and ``rlhf_ext_startup.pth``."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            target = self.get_finalized_command("install").install_lib
        else:
            target = self.build_lib
        os.makedirs(target, exist_ok=True)
        self._startup_outputs = []
        for name, content in _startup_files().items():
            path = os.path.join(target, name)
            with open(path, "w", encoding="utf-8") as f:
                f.write(content)
            self._startup_outputs.append(path)

    def get_outputs(self, include_bytecode=True):
        outputs = list(super().get_outputs(include_bytecode))
        if not getattr(self, "editable_mode", False):
            outputs.extend(os.path.join(self.build_lib, name) for name in _startup_files())
        return outputs


def cmdclass():
    return {"build_py": BuildPyWithStartupHook}
