"""tffl: federated fine-tuning and personalization as TensorFlow Federated computations.

Importing `tffl` has no side effects: each submodule loads on first use (`tffl.lora_fl`, or
`from tffl import lora_fl`), so `tffl.roles`, which the Keras models import, does not pull in
TFF or gRPC. The modules that build or run federated computations (`client_training`, and so
every algorithm, `linear_engine`, `simulation`) import `tffl.runtime`, whose exit hook stops
every TFF worker process this Python process started (TFF's own default-context worker
included).

>>> import tffl
>>> sorted(tffl.__all__)[:3]
['adaptpfl', 'adaptpfl_linear', 'checkpoint']
"""

import importlib

__all__ = [
    "adaptpfl", "adaptpfl_linear", "checkpoint", "client_training", "communication", "engine",
    "evaluation", "factor_aggregation", "fedrep_linear", "flute", "flute_linear", "frozen",
    "linear_engine", "lora_fl",
    "lora_ranks",
    "participation", "personal_state", "personalized", "plots", "processes", "production",
    "roles", "rolora_linear", "runtime", "server_steps", "simulation", "srpfl",
]


def __getattr__(name: str):
    """`tffl.<submodule>` imports it on first access (PEP 562)."""
    if name in __all__:
        return importlib.import_module(f"tffl.{name}")
    raise AttributeError(f"module 'tffl' has no attribute {name!r}")
