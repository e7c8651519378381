"""The engine: roles, frozen weights, client work, round builder, server steps, composition, schedules and the processes.

`tffl.engine.X` for a name of `tffl.engine.rounds` (`build_round`, `RoundSpec`, ...) is that module's."""

from tffl import lazy_package

_SUBMODULES = ('client_hooks', 'client_training', 'communication', 'composition', 'factor_aggregation', 'feature_cache', 'federated_evaluation', 'federated_model', 'frozen', 'linear_engine', 'linear_rounds', 'model_spec', 'personal_state', 'process', 'roles', 'rounds', 'schedules', 'server_steps', 'switch_round')

__getattr__ = lazy_package(__name__, "rounds", _SUBMODULES)
