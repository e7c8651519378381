"""The engine: roles, frozen weights, client work, round builder, server steps, composition, schedules and the processes.

`tffl.engine.X` for a name of `tffl.engine.rounds` (`build_round`, `RoundSpec`, ...) is that module's."""

import importlib

_SUBMODULES = ('client_hooks', 'client_training', 'communication', 'composition', 'factor_aggregation', 'feature_cache', 'federated_evaluation', 'federated_model', 'frozen', 'linear_engine', 'linear_processes', 'linear_rounds', 'model_spec', 'personal_state', 'processes', 'roles', 'rounds', 'schedules', 'server_steps', 'switch_round')


def __getattr__(name: str):
    """`tffl.engine.<submodule>` loads on first use; other names are `rounds`'s (PEP 562)."""
    if name in _SUBMODULES:
        return importlib.import_module(f"tffl.engine.{name}")
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module("tffl.engine.rounds"), name)
