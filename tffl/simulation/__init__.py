"""The simulation: the driver (`run_rounds`, whose names `tffl.simulation.X` gives), participation
with SRPFL, checkpoints, metrics and plots."""

import importlib

_SUBMODULES = ('checkpoint', 'driver', 'evaluation', 'metrics_log', 'participation', 'plots', 'srpfl', 'srpfl_schedule')


def __getattr__(name: str):
    """`tffl.simulation.<submodule>` loads on first use; other names are `driver`'s (PEP 562)."""
    if name in _SUBMODULES:
        return importlib.import_module(f"tffl.simulation.{name}")
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module("tffl.simulation.driver"), name)
