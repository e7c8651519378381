"""tffl.runtime.personalized_program: FedRep in a TFF program (program state with every client's
personal state, TFF's release managers), resumed exactly, leaving no worker; linear AdaptPFL
(tensor client data, keyed personal states) resumed exactly (large tier); and TFF's own
`train_model` refusing a personalized process before it saves any program state.

The model is the linear f(x) = x·W·h of tests/tffl/algorithms/personalized_models.py (W the
averaged representation, h the personal head, squared error, one full batch per client), so
every round has a float64 numpy reference (`numpy_round`), and the clients a round takes are
recomputed here from the source's seed: round r takes sorted(default_rng([seed, r]).choice(N, k)).
"""

import asyncio
import collections
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests.tffl.algorithms.personalized_models import (build, full_batch_datasets,
                                                       initial_weights, linear_clients,
                                                       numpy_round)
from tffl import runtime
from tffl.runtime import program
from tffl.runtime import workers
from tffl.algorithms import adaptpfl_linear
from tffl.runtime import personalized_program

_SIZES, _SEED, _PER_ROUND = (5, 8, 3), 7, 2
_TAU_H, _TAU_R = 2, 1
_CLIENTS = linear_clients(sizes=_SIZES, seed=0)
_TESTS = linear_clients(sizes=(4, 2, 6), seed=1)


def _fedrep():
    return build("fedrep", head_epochs=_TAU_H, representation_epochs=_TAU_R)


def _chosen(round_num):
    """The clients of round `round_num`, recomputed from the seed (the module docstring)."""
    rng = np.random.default_rng([_SEED, round_num])
    return sorted(int(i) for i in rng.choice(len(_SIZES), size=_PER_ROUND, replace=False))


def _program(process, state_dir, total_rounds, evaluation_periodicity=3):
    """One program in its own `program_runtime()`, on a freshly built source: the released
    train metrics, evaluation metrics and models."""
    metrics, evaluations, models = (tff.program.MemoryReleaseManager() for _ in range(3))
    with runtime.program_runtime():
        asyncio.run(personalized_program.train_personalized_model(
            train_process=process,
            train_data_source=program.ClientDataSource(
                "personalized", full_batch_datasets(_CLIENTS), seed=_SEED),
            train_config=personalized_program.TrainConfig(per_round_clients=_PER_ROUND,
                                                          total_rounds=total_rounds),
            program_state_manager=tff.program.FileProgramStateManager(str(state_dir)),
            model_output_manager=models,
            train_metrics_manager=metrics,
            evaluation=personalized_program.EvaluationConfig(
                full_batch_datasets(_CLIENTS), full_batch_datasets(_TESTS), evaluations,
                periodicity=evaluation_periodicity),
        ))
    assert workers.running_workers() == []   # no worker_binary child of this process is left
    return metrics.values(), evaluations.values(), models.values()


def _flat(model):
    """W and every client's head, float64."""
    w = np.asarray(model.state.global_model_weights.trainable[0], np.float64)
    return [w] + [np.asarray(p[0], np.float64) for p in model.personal_states]


def test_fedrep_program_resumes_to_the_uninterrupted_run_which_equals_numpy(tmp_path):
    process = _fedrep()
    with runtime.local_runtime():
        w, h0 = initial_weights(process)
    heads = [h0] * len(_SIZES)
    for round_num in range(1, 5):   # numpy: the chosen clients train, the others keep their head
        chosen = _chosen(round_num)
        w, new = numpy_round("fedrep", [_CLIENTS[i] for i in chosen], w,
                             [heads[i] for i in chosen], tau_h=_TAU_H, tau_r=_TAU_R)
        heads = [new[chosen.index(i)] if i in chosen else h for i, h in enumerate(heads)]

    metrics, evaluations, models = _program(process, tmp_path / "whole", 4)
    whole = _flat(models["training_checkpoint_round_4"])
    for got, want in zip(whole, [w, *heads], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert list(metrics) == [1, 2, 3, 4]
    for round_num, released in metrics.items():   # TFF's form: client_work/train -> model_metrics
        assert float(released["model_metrics"]["num_examples"]) == sum(
            _SIZES[i] for i in _chosen(round_num))
    # Evaluated every 3 rounds and after the last: each client's own head on its own test data.
    assert list(evaluations) == [3, 4]
    errors = [np.sum((x @ w @ h - y) ** 2) for (x, y), h in zip(_TESTS, heads)]
    assert float(evaluations[4]["loss"]) == pytest.approx(
        sum(errors) / sum(len(x) for x, _ in _TESTS), rel=1e-4)

    first_metrics, _, first_models = _program(process, tmp_path / "split", 2)
    assert list(first_metrics) == [1, 2] and list(first_models) == ["training_checkpoint_round_2"]
    halfway = _flat(first_models["training_checkpoint_round_2"])
    assert any(not np.allclose(a, b) for a, b in zip(halfway, whole))   # rounds 3, 4 train

    # A new program over the same state directory, with a freshly built process and source.
    resumed_metrics, resumed_evaluations, resumed_models = _program(
        _fedrep(), tmp_path / "split", 4)
    assert list(resumed_metrics) == [3, 4]   # rounds 1, 2 are not run again
    for got, want in zip(_flat(resumed_models["training_checkpoint_round_4"]), whole,
                         strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    for round_num in (3, 4):   # the resumed rounds took the uninterrupted run's clients
        for name in ("loss", "num_examples"):
            np.testing.assert_allclose(resumed_metrics[round_num]["model_metrics"][name],
                                       metrics[round_num]["model_metrics"][name], rtol=1e-6)
    np.testing.assert_allclose(resumed_evaluations[4]["loss"], evaluations[4]["loss"], rtol=1e-6)

    # One program state per round, each holding the server state and every client's head.
    manager = tff.program.FileProgramStateManager(str(tmp_path / "split"))
    assert asyncio.run(manager.get_versions()) == [0, 1, 2, 3, 4]


def test_train_model_refuses_a_personalized_process_before_saving_program_state(tmp_path):
    state_dir = tmp_path / "state"
    with runtime.program_runtime():
        with pytest.raises(TypeError) as error:
            asyncio.run(tff.learning.programs.train_model(
                train_process=_fedrep(),
                train_data_source=program.ClientDataSource(
                    "refused", full_batch_datasets(_CLIENTS), seed=_SEED),
                train_per_round_clients=_PER_ROUND,
                train_total_rounds=2,
                program_state_manager=tff.program.FileProgramStateManager(str(state_dir)),
                model_output_manager=tff.program.MemoryReleaseManager(),
                train_metrics_manager=tff.program.MemoryReleaseManager(),
                evaluation_manager=None,
                evaluation_periodicity=1,
            ))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("fedrep keeps a personal state per client")
    assert message.endswith("tffl.runtime.personalized_program.train_personalized_model")
    assert os.listdir(state_dir) == []
    assert workers.running_workers() == []


def test_bad_arguments_raise_one_line_errors(tmp_path):
    source = program.ClientDataSource("bad", full_batch_datasets(_CLIENTS), seed=_SEED)
    config = personalized_program.TrainConfig(per_round_clients=1, total_rounds=1)
    managers = dict(program_state_manager=tff.program.FileProgramStateManager(str(tmp_path)),
                    model_output_manager=tff.program.MemoryReleaseManager())

    def run(process, data_source=source, **kwargs):
        asyncio.run(personalized_program.train_personalized_model(
            train_process=process, train_data_source=data_source, train_config=config,
            **managers, **kwargs))

    stateless = build("fedavg")
    with pytest.raises(ValueError, match="'fedavg' keeps no personal state: run it with "
                                         "tff.learning.programs.train_model"):
        run(stateless)
    with pytest.raises(TypeError, match="train_data_source is a list: pass a "
                                        "tffl.runtime.program.ClientDataSource"):
        run(stateless, data_source=full_batch_datasets(_CLIENTS))
    with pytest.raises(ValueError, match="evaluation has 2 clients, the data source 3"):
        run(_fedrep(), evaluation=personalized_program.EvaluationConfig(
            full_batch_datasets(_CLIENTS[:2]), full_batch_datasets(_TESTS[:2]),
            tff.program.MemoryReleaseManager()))
    with pytest.raises(ValueError, match="per_round_clients=0 must be an int >= 1"):
        personalized_program.TrainConfig(per_round_clients=0, total_rounds=1)
    with pytest.raises(ValueError, match="periodicity=0 must be an int >= 1"):
        personalized_program.EvaluationConfig([], [], tff.program.MemoryReleaseManager(), 0)
    assert os.listdir(tmp_path) == []   # refused before any program state


@pytest.mark.large
def test_linear_adaptpfl_with_keyed_personal_states_resumes_exactly(tmp_path):
    """Linear AdaptPFL: tensor client data `{x, y}`, a keyed personal state (head, shortcut).
    Stopped after round 2 and started again to 3, it ends as the uninterrupted 3 rounds."""
    rng = np.random.default_rng(0)
    clients = [collections.OrderedDict(x=rng.normal(size=(n, 6)).astype(np.float32),
                                       y=rng.normal(size=n).astype(np.float32))
               for n in (5, 7, 9)]

    def run(state_dir, total_rounds):
        models = tff.program.MemoryReleaseManager()
        with runtime.program_runtime():
            asyncio.run(personalized_program.train_personalized_model(
                train_process=adaptpfl_linear.build_adaptpfl_linear(
                    adaptpfl_linear.AdaptPFLLinearConfig(6, 2, 0.3, 0.1)),
                train_data_source=program.ClientDataSource("linear", clients, seed=1),
                train_config=personalized_program.TrainConfig(2, total_rounds),
                program_state_manager=tff.program.FileProgramStateManager(str(state_dir)),
                model_output_manager=models))
        assert workers.running_workers() == []
        final = models.values()[f"training_checkpoint_round_{total_rounds}"]
        return [np.asarray(v) for v in tf.nest.flatten((final.state, final.personal_states))]

    whole = run(tmp_path / "whole", 3)
    halfway = run(tmp_path / "split", 2)
    assert any(not np.allclose(a, b) for a, b in zip(halfway, whole))   # round 3 trains
    for got, want in zip(run(tmp_path / "split", 3), whole, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
