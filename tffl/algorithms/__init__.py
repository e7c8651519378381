"""The algorithms: one module per family (federated LoRA, personalized, linear) and `ALGORITHMS`,
the one registry (`tffl.algorithms.registry`, whose names `tffl.algorithms.X` gives)."""

from tffl import lazy_package

_SUBMODULES = ('adaptpfl', 'adaptpfl_linear', 'fedrep_linear', 'flute', 'flute_linear', 'lora_fl', 'lora_plans', 'lora_ranks', 'personalized', 'personalized_builders', 'registry', 'rolora_linear')

__getattr__ = lazy_package(__name__, "registry", _SUBMODULES)
