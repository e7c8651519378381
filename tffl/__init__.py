"""tffl: federated fine-tuning and personalization as TensorFlow Federated computations.

The layout (docs/engine.md): `tffl.engine` (roles, frozen weights, client work, the round builder,
server steps, the composer, schedules, the processes), `tffl.algorithms` (one module per family
and `ALGORITHMS`, the one registry, in `tffl.algorithms.registry`), `tffl.simulation` (the
driver `tffl.simulation.driver.run_rounds`, participation with SRPFL, checkpoints, metrics,
plots), `tffl.runtime` (TFF execution contexts and workers) and `tffl.production`
(MapReduceForm / DistributeAggregateForm, serialization). Every name is imported from the
module that defines it (`from tffl.algorithms import lora_fl`).

Importing `tffl` (or `tffl.engine`, `tffl.algorithms`, `tffl.simulation`) loads nothing else, so
`tffl.engine.roles`, which the Keras models import, does not pull in TFF or gRPC. Its one effect
is an exit hook (`_stop_tff_at_exit`): if the process imported TFF, `tffl.runtime.workers`' exit
step runs, which stops every TFF worker process this Python process started (TFF's own
default-context worker included) and drops TFF's import-time default context, whose `__del__`
would otherwise print a traceback at interpreter teardown. The modules that run federated
computations import `tffl.runtime`, which registers the same step; the hook here covers the
modules that only import TFF (`tffl.production`, `tffl.engine.process`, `tasks.client_data`, ...).
"""

import atexit
import sys


def _stop_tff_at_exit() -> None:
    """At exit, if TFF was imported: `tffl.runtime.workers`' exit step (module docstring)."""
    if "tensorflow_federated" in sys.modules:
        from tffl.runtime import workers

        workers.at_exit()


atexit.register(_stop_tff_at_exit)
