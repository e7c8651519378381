"""Program logic for personalized processes: TFF's `train_model`, carrying the personal states.

TFF's `tff.learning.programs.train_model` runs a `tff.learning.templates.LearningProcess`,
`next: (S@SERVER, D@CLIENTS) -> (S, metrics)`. A personalized process (FedRep, FedPer,
LG-FedAvg, FLUTE, AdaptPFL, FedSA-LoRA: a `tffl.engine.process.Process` with `personal`
declared) has a third argument and result, the participating clients' personal states:

    next: (S@SERVER, D@CLIENTS, P@CLIENTS) -> PersonalizedOutput(S@SERVER, P@CLIENTS, m@SERVER)

`train_personalized_model` is `train_model` for it, with TFF's arguments, managers and loop. The
population of N clients is the `ClientDataSource`'s (client i is position i, its data in round r
`population(r)[i]`), and the program keeps a personal state P_i for each, from
`process.initialize_personal(str(i))`. Round r (1, ..., R) runs

    C_r = iterator.next_clients(k);  D = iterator.select(k)            (k clients, seeded by r)
    S, (P_i)_{i ∈ C_r}, m_r = next(S, D, (P_i)_{i ∈ C_r})               (others keep their P_i)

then releases m_r (TFF's form: `client_work/train` moved to `model_metrics`) with key r,
optionally evaluates every client's own model on its own test data, releases the model
(`PersonalizedState(S, [P_1, ..., P_N])`, every 10 rounds and after the last, as
`train_model` does) and saves the program state `ProgramState(S, [P_1..P_N], r, iterator)` as
version r. The program state holds the server state, every client's personal state and the
data iterator's position together, so a program started again over the same state directory
loads the latest version and continues exactly where it stopped (version 0 is the initial
state, saved before any round).

What differs from `train_model`: evaluation runs in the training loop on the process's own
personalized evaluation (`EvaluationConfig`; TFF's `EvaluationManager` evaluates global model
weights only), every `periodicity` rounds (an int: a time-based period would make a resumed run
differ); a round is not retried (`should_discard_round`); and the clients of one call must serve
one communication round (a process whose `next` runs a cycle of rounds on each client's data,
`data_names`, needs the same clients in every round of the cycle, which `ClientDataSource`'s
per-round choice does not give: run those with `tffl.simulation.driver.run_rounds`).

Run it inside `tffl.runtime.program_runtime()`, whose context (a
`tffl.runtime.program.SimulationFederatedContext`) returns the personal states to the program.
FedRep on two clients (`model_fn`: a LoRA net with a personal head), one client per round:

>>> import asyncio
>>> from tffl.algorithms import personalized
>>> process = personalized.build_personalized_process("fedrep", model_fn, input_spec, 0.1)
>>> states = tff.program.FileProgramStateManager(run_dir / "fedrep_state")
>>> models = tff.program.MemoryReleaseManager()
>>> with runtime.program_runtime():
...     asyncio.run(train_personalized_model(
...         train_process=process,
...         train_data_source=program.ClientDataSource("doctest", datasets, seed=0),
...         train_config=TrainConfig(per_round_clients=1, total_rounds=2),
...         program_state_manager=states,
...         model_output_manager=models))
>>> asyncio.run(states.get_versions())           # the initial state and one per round
[0, 1, 2]
>>> final = models.values()["training_checkpoint_round_2"]
>>> process.round_num(final.state), len(final.personal_states)
(2, 2)
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine import personal_state
from tffl.engine.personal_state import PersonalSpec
from tffl.engine.process import Process
from tffl.runtime import program

MODEL_RELEASE_PERIOD = 10  # the model is released every 10 rounds and after the last (train_model)


class PersonalizedState(NamedTuple):
    """The trained model: the server state and every client's personal state, in the population's
    order (what `model_output_manager` releases)."""

    state: Any
    personal_states: list


class ProgramState(NamedTuple):
    """What the program state manager saves each round (version `round_number`): TFF's
    `ProgramState` with every client's personal state beside the server state."""

    state: Any
    personal_states: list
    round_number: int
    data_iterator: program.ClientDataIterator


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How many clients each round and how many rounds: `train_model`'s `train_per_round_clients`
    and `train_total_rounds`; `initial_train_state` is its argument of that name (None: the
    process's `initialize()`)."""

    per_round_clients: int
    total_rounds: int
    initial_train_state: Any = None

    def __post_init__(self):
        if not (isinstance(self.per_round_clients, (int, np.integer))
                and self.per_round_clients >= 1):
            raise ValueError(f"per_round_clients={self.per_round_clients!r} must be an int >= 1")
        if not (isinstance(self.total_rounds, (int, np.integer)) and self.total_rounds >= 0):
            raise ValueError(f"total_rounds={self.total_rounds!r} must be an int >= 0")


@dataclasses.dataclass(frozen=True)
class EvaluationConfig:
    """Personalized evaluation in the program: every client of the population with its own
    personal state, fine-tuned on `train_datasets[i]` where the process does (FedAvg-FT), tested
    on `test_datasets[i]` (`Process.evaluation.computation`); its metrics (`loss`, `accuracy`,
    `mean_client_accuracy`, `num_examples`) are released by `manager` with the round as key,
    every `periodicity` rounds and after the last."""

    train_datasets: Sequence[tf.data.Dataset]
    test_datasets: Sequence[tf.data.Dataset]
    manager: tff.program.ReleaseManager
    periodicity: int = 1

    def __post_init__(self):
        if len(self.train_datasets) != len(self.test_datasets):
            raise ValueError(f"{len(self.train_datasets)} train but {len(self.test_datasets)} "
                             "test datasets: give both for every client, in population order")
        if not (isinstance(self.periodicity, int) and self.periodicity >= 1):
            raise ValueError(f"periodicity={self.periodicity!r} must be an int >= 1 (rounds)")


def _check_arguments(train_process, train_data_source, evaluation) -> int:
    """The population's size, after one-line errors for what this program logic cannot run."""
    if not isinstance(train_data_source, program.ClientDataSource):
        raise TypeError(f"train_data_source is a {type(train_data_source).__name__}: pass a "
                        "tffl.runtime.program.ClientDataSource (it names the chosen clients)")
    population = len(train_data_source.population(1))
    if not isinstance(train_process, Process) or train_process.personal is None:
        raise ValueError(f"train_process {getattr(train_process, 'algorithm', train_process)!r} "
                         "keeps no personal state: run it with tff.learning.programs.train_model")
    if train_process.data_names is not None:
        raise ValueError(f"{train_process.algorithm}'s next runs the rounds "
                         f"{list(train_process.data_names)} on the same clients, which "
                         "ClientDataSource chooses per round: run it with "
                         "tffl.simulation.driver.run_rounds")
    if evaluation is not None and len(evaluation.train_datasets) != population:
        raise ValueError(f"evaluation has {len(evaluation.train_datasets)} clients, the data "
                         f"source {population}: give every client's datasets, in its order")
    if evaluation is not None and train_process.evaluation is None:
        raise ValueError(f"{train_process.algorithm} was built without an evaluation: pass "
                         "evaluation=None")
    return population


def _numpy(value):
    return tf.nest.map_structure(np.asarray, value)


def _column_first(personal_states: list, spec: PersonalSpec):
    """The personal states as TFF's program context takes a CLIENTS-placed struct (column-first,
    as `ClientDataIterator.select` serves data): one list over the clients per tensor."""
    columns = [[spec.values(p)[j] for p in personal_states] for j in range(len(spec.names))]
    return dict(zip(spec.names, columns)) if spec.keyed else tff.structure.Struct(
        [(None, c) for c in columns])


async def _evaluate(train_process, evaluation: EvaluationConfig, state, personal_states):
    """`evaluation`'s metrics of every client, each on its own model."""
    weights = await tff.program.materialize_value(train_process.get_model_weights(state))
    metrics = await tff.program.materialize_value(train_process.evaluation.computation(
        weights, _column_first(personal_states, train_process.personal),
        list(evaluation.train_datasets), list(evaluation.test_datasets)))
    return {name: np.asarray(value) for name, value in metrics.items()}


async def _start(train_process, train_data_source, train_config, program_state_manager):
    """The latest saved program state, or the initial one (saved as version 0)."""
    population = len(train_data_source.population(1))
    iterator = train_data_source.iterator()
    state = train_config.initial_train_state
    if state is None:
        state = await tff.program.materialize_value(train_process.initialize())
    personal_states = [_numpy(train_process.initialize_personal(str(i)))
                       for i in range(population)]
    initial = ProgramState(state, personal_states, 0, iterator)
    loaded, _ = await program_state_manager.load_latest(initial)
    if loaded is not None:
        return ProgramState(loaded.state, list(loaded.personal_states), int(loaded.round_number),
                            loaded.data_iterator)
    await program_state_manager.save(initial, version=0)
    return initial


async def _release(managers, round_num: int, total_rounds: int, metrics, model) -> None:
    """The round's train metrics (TFF's `model_metrics` form) and, every 10 rounds and after the
    last, the model."""
    train_metrics_manager, model_output_manager = managers
    releases = []
    if train_metrics_manager is not None:
        try:
            released = tff.learning.programs.extract_and_rewrap_metrics(
                metrics, path=("client_work", "train"))
        except KeyError:
            raise KeyError("train_personalized_model needs a process whose next's metrics have "
                           f"client_work/train; got {list(metrics)}") from None
        releases.append(train_metrics_manager.release(released, key=round_num))
    if round_num % MODEL_RELEASE_PERIOD == 0 or round_num == total_rounds:
        releases.append(model_output_manager.release(
            model, key=f"training_checkpoint_round_{round_num}"))
    await asyncio.gather(*releases)


async def train_personalized_model(
    *,
    train_process: Process,
    train_data_source: program.ClientDataSource,
    train_config: TrainConfig,
    program_state_manager: tff.program.ProgramStateManager,
    model_output_manager: tff.program.ReleaseManager,
    train_metrics_manager: tff.program.ReleaseManager | None = None,
    evaluation: EvaluationConfig | None = None,
) -> None:
    """Runs `train_config.total_rounds` rounds of a personalized process (module docstring),
    resuming from the latest program state `program_state_manager` holds.

    Args:
      train_process: a personalized `tffl.engine.process.Process` (`personal` declared) whose
        `next` runs one communication round (`data_names` None).
      train_data_source: the population, a `tffl.runtime.program.ClientDataSource`; to resume,
        build it again with the same name and seed (its iterator is saved by position).
      train_config: clients per round, total rounds, and the initial server state.
      program_state_manager: saves `ProgramState` as version r after round r (version 0: the
        initial state), e.g. `tff.program.FileProgramStateManager`.
      model_output_manager: releases `PersonalizedState(state, personal_states)` every 10 rounds
        and after the last, keyed `training_checkpoint_round_<r>`.
      train_metrics_manager: releases round r's metrics with key r (None: not released).
      evaluation: personalized evaluation of every client (None: none).

    Raises:
      ValueError: a process without personal state (use `tff.learning.programs.train_model`),
        one whose `next` spans several rounds, or evaluation data of another population.
      TypeError: a data source other than `ClientDataSource`; no TFF program context.
    """
    _check_arguments(train_process, train_data_source, evaluation)
    tff.program.check_in_federated_context()
    with personal_state.carried_by_program():
        start = await _start(train_process, train_data_source, train_config,
                             program_state_manager)
    state, personal_states = start.state, list(start.personal_states)
    iterator, total = start.data_iterator, train_config.total_rounds
    for round_num in range(start.round_number + 1, total + 1):
        clients = iterator.next_clients(train_config.per_round_clients)
        data = iterator.select(train_config.per_round_clients)
        output = await tff.program.materialize_value(
            train_process.next(state, data, [personal_states[i] for i in clients]))
        state = output.state
        for i, personal in zip(clients, output.personal_states):
            personal_states[i] = _numpy(personal)
        if evaluation is not None and (round_num % evaluation.periodicity == 0
                                       or round_num == total):
            metrics = await _evaluate(train_process, evaluation, state, personal_states)
            await evaluation.manager.release(metrics, key=round_num)
        await _release((train_metrics_manager, model_output_manager), round_num, total,
                       output.metrics, PersonalizedState(state, list(personal_states)))
        await program_state_manager.save(
            ProgramState(state, list(personal_states), round_num, iterator), version=round_num)
