"""tffl: federated fine-tuning and personalization as TensorFlow Federated computations.

The layout (docs/engine.md): `tffl.engine` (roles, frozen weights, client work, the round builder,
server steps, composition, schedules, the processes), `tffl.algorithms` (one module per family
and `ALGORITHMS`, the one registry), `tffl.simulation` (the driver `run_rounds`, participation
with SRPFL, checkpoints, metrics, plots), `tffl.runtime` (TFF execution contexts and workers)
and `tffl.production` (MapReduceForm / DistributeAggregateForm, serialization).

Importing `tffl` loads nothing else: each subpackage and module loads on first use
(`tffl.algorithms.lora_fl`, or `from tffl.algorithms import lora_fl`), so `tffl.engine.roles`,
which the Keras models import, does not pull in TFF or gRPC. Its one effect is an exit hook
(`_stop_tff_at_exit`): if the process imported TFF, `tffl.runtime.workers`' exit step runs, which
stops every TFF worker process this Python process started (TFF's own default-context worker
included) and drops TFF's import-time default context, whose `__del__` would otherwise print a
traceback at interpreter teardown. The modules that run federated computations import
`tffl.runtime`, which registers the same step; the hook here covers the modules that only import
TFF (`tffl.production`, `tffl.engine.process`, `tasks.client_data`, ...).

The flat names of tffl 0.1 (`tffl.lora_fl`, `from tffl import simulation`, ...) still resolve,
to the moved modules (`MOVED`).

>>> import tffl
>>> sorted(tffl.__all__)
['algorithms', 'engine', 'production', 'runtime', 'simulation']
>>> tffl.lora_fl is tffl.algorithms.lora_fl
True
"""

import atexit
import importlib
import sys

__all__ = ["algorithms", "engine", "production", "runtime", "simulation"]

# tffl 0.1's flat module names -> where they live now.
MOVED = {'adaptpfl': 'tffl.algorithms.adaptpfl', 'adaptpfl_linear': 'tffl.algorithms.adaptpfl_linear', 'checkpoint': 'tffl.simulation.checkpoint', 'client_hooks': 'tffl.engine.client_hooks', 'client_training': 'tffl.engine.client_training', 'communication': 'tffl.engine.communication', 'composition': 'tffl.engine.composition', 'evaluation': 'tffl.simulation.evaluation', 'factor_aggregation': 'tffl.engine.factor_aggregation', 'feature_cache': 'tffl.engine.feature_cache', 'federated_evaluation': 'tffl.engine.federated_evaluation', 'federated_model': 'tffl.engine.federated_model', 'fedrep_linear': 'tffl.algorithms.fedrep_linear', 'flute': 'tffl.algorithms.flute', 'flute_linear': 'tffl.algorithms.flute_linear', 'frozen': 'tffl.engine.frozen', 'linear_engine': 'tffl.engine.linear_engine', 'linear_processes': 'tffl.engine.process', 'linear_rounds': 'tffl.engine.linear_rounds', 'lora_fl': 'tffl.algorithms.lora_fl', 'lora_plans': 'tffl.algorithms.lora_plans', 'lora_ranks': 'tffl.algorithms.lora_ranks', 'metrics_log': 'tffl.simulation.metrics_log', 'model_spec': 'tffl.engine.model_spec', 'participation': 'tffl.simulation.participation', 'personal_state': 'tffl.engine.personal_state', 'personalized': 'tffl.algorithms.personalized', 'personalized_builders': 'tffl.algorithms.personalized_builders', 'plots': 'tffl.simulation.plots', 'processes': 'tffl.engine.process', 'roles': 'tffl.engine.roles', 'rolora_linear': 'tffl.algorithms.rolora_linear', 'schedules': 'tffl.engine.schedules', 'server_steps': 'tffl.engine.server_steps', 'srpfl': 'tffl.simulation.srpfl', 'srpfl_schedule': 'tffl.simulation.srpfl_schedule', 'switch_round': 'tffl.engine.switch_round'}


def lazy_package(package: str, main: str, submodules):
    """The `__getattr__` (PEP 562) of a subpackage: `<package>.<submodule>` loads on first use;
    any other name is the `main` module's (e.g. `tffl.simulation.run_rounds`)."""

    def getattr_(name: str):
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(importlib.import_module(f"{package}.{main}"), name)

    return getattr_


def __getattr__(name: str):
    """`tffl.<subpackage>` imports it on first access (PEP 562); so do the 0.1 names."""
    if name in __all__:
        return importlib.import_module(f"tffl.{name}")
    if name in MOVED:
        return importlib.import_module(MOVED[name])
    raise AttributeError(f"module 'tffl' has no attribute {name!r}")


def _stop_tff_at_exit() -> None:
    """At exit, if TFF was imported: `tffl.runtime.workers`' exit step (module docstring)."""
    if "tensorflow_federated" in sys.modules:
        from tffl.runtime import workers

        workers.at_exit()


atexit.register(_stop_tff_at_exit)
