"""Plans to export, and the frameworks' own parsers (the `frameworks` extra: deepspeed
0.19.6, megatron-core 0.16.1, torchtitan 0.2.2; `make test` installs it). Without the
extra these tests skip, except under CI, where a missing framework fails them."""

import importlib
import importlib.util
import os
import sys
import types

import pytest

from planner.specs.cluster import load_cluster, parse_gpus_arg
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import preset
from planner.specs.plan import Kernels, Sharding

SELENE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "cluster_specs",
                      "selene-a100.yaml")


def framework(module: str):
    """Import a framework module, or skip (fail under CI) when the extra is missing."""
    top = module.split(".")[0]
    if top not in sys.modules and importlib.util.find_spec(top) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{module} is not installed: `make test` installs the frameworks extra")
        pytest.skip(f"{module} not installed (pip install -c constraints.txt '.[frameworks]')")
    return importlib.import_module(module)


def torchtitan_config_manager():
    """torchtitan 0.2.2's ConfigManager. The package's __init__ registers float8/MoE
    quantization converters that import triton (a CUDA-only dependency the CPU torch
    lacks); the config manager needs none of it, so the package is entered as a plain
    namespace and torchtitan.config.manager is imported as shipped."""
    if "torchtitan.config.manager" not in sys.modules:
        spec = importlib.util.find_spec("torchtitan")
        if spec is None:
            framework("torchtitan")
        pkg = types.ModuleType("torchtitan")
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__spec__ = spec
        sys.modules.setdefault("torchtitan", pkg)
    return importlib.import_module("torchtitan.config.manager").ConfigManager


def gpt3_on_selene(**kw):
    """The issue's check plan: GPT-3 175B on Selene as Megatron-LM runs it."""
    cfg = dict(tp=8, pp=16, dp=8, vp=3, mbs=1, gbs=1536, seq_len=2048, recompute="selective",
               sequence_parallel=True, sharding=Sharding(optim=8))
    cfg.update(kw)
    return homogeneous_plan(preset("gpt3-175b"), load_cluster(SELENE), ParallelConfig(**cfg),
                            kernels=Kernels(attention="flash"))


def plan_on(gpus: str, model: str = "llama3-8b", attention: str = "flash", **kw):
    cfg = dict(tp=1, pp=1, dp=8, mbs=2, gbs=64, seq_len=2048, recompute="none")
    cfg.update(kw)
    return homogeneous_plan(preset(model), parse_gpus_arg(gpus), ParallelConfig(**cfg),
                            kernels=Kernels(attention=attention))
