"""The algorithms: one module per family (federated LoRA, personalized, linear) and `ALGORITHMS`,
the one registry (`tffl.algorithms.registry`, whose names `tffl.algorithms.X` gives)."""

import importlib

_SUBMODULES = ('adaptpfl', 'adaptpfl_linear', 'fedrep_linear', 'flute', 'flute_linear', 'lora_fl', 'lora_plans', 'lora_ranks', 'personalized', 'personalized_builders', 'registry', 'rolora_linear')


def __getattr__(name: str):
    """`tffl.algorithms.<submodule>` loads on first use; other names are `registry`'s (PEP 562)."""
    if name in _SUBMODULES:
        return importlib.import_module(f"tffl.algorithms.{name}")
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module("tffl.algorithms.registry"), name)
