"""The simulation: the driver (`run_rounds`, whose names `tffl.simulation.X` gives), participation
with SRPFL, checkpoints, metrics and plots."""

from tffl import lazy_package

_SUBMODULES = ('checkpoint', 'driver', 'evaluation', 'metrics_log', 'participation', 'plots', 'srpfl', 'srpfl_schedule')

__getattr__ = lazy_package(__name__, "driver", _SUBMODULES)
