"""tffl.runtime.program_runtime: TFF's own program layer (`tff.learning.programs.train_model`,
`tff.program` state and release managers) on managed workers, resumable, leaving no worker."""

import asyncio
import collections
import copy
import pathlib

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from models.paper_models import RoloraMnistNetConfig, build_rolora_mnist_net
from tffl.algorithms import fedrep_linear
from tffl.algorithms import lora_fl
from tffl.algorithms import lora_plans
from tffl.algorithms import personalized
from tffl.algorithms import rolora_linear
from tffl import runtime
from tffl.runtime import program
from tffl.runtime import workers
from tffl.runtime.tff_internals import context_stack_impl
from tests.tiers import tiered

_D, _CLASSES, _BATCH = 8, 3, 3
_SIZES = (4, 6, 5)  # three clients of distinct sizes: the examples counted show who was chosen
_PER_ROUND = 2


def _model_fn():
    # base_kernel: a frozen W0 linked to the adapter, which FLoRA merges into.
    return build_rolora_mnist_net(RoloraMnistNetConfig(
        input_dim=_D, rank=2, num_classes=_CLASSES, b_stddev=0.1, trainable_head=True,
        base_kernel=True))


_SPEC = (tf.TensorSpec([None, _D], tf.float32), tf.TensorSpec([None], tf.int32))


def _client_datasets():
    rng = np.random.default_rng(0)
    return [tf.data.Dataset.from_tensor_slices(
        (rng.normal(size=(n, _D)).astype(np.float32),
         rng.integers(0, _CLASSES, size=n).astype(np.int32))).batch(_BATCH) for n in _SIZES]


def _source(name="train", data_names=None):
    return program.ClientDataSource(name, _client_datasets(), seed=7, data_names=data_names)


def _size(dataset) -> int:
    return sum(int(x.shape[0]) for x, _ in dataset)


# --- the data source, without workers ---------------------------------------------------------

def test_client_data_source_is_seeded_per_round_and_copyable():
    source = program.ClientDataSource("unit", [tf.data.Dataset.range(n) for n in (10, 20, 30, 40)],
                                      seed=3)
    first, second = source.iterator(), source.iterator()
    rounds = [[int(d.cardinality()) for d in first.select(2)] for _ in range(6)]
    assert rounds == [[int(d.cardinality()) for d in second.select(2)] for _ in range(6)]
    assert len({tuple(r) for r in rounds}) > 1  # not the same clients every round
    assert all(len(set(r)) == 2 for r in rounds)  # without replacement within a round

    clone = copy.deepcopy(first)  # what train_model does each round; datasets are shared
    assert clone == first and clone.source is source and clone.rounds_served == 6
    assert [int(d.cardinality()) for d in clone.select(2)] == [
        int(d.cardinality()) for d in first.select(2)]

    restored = program.ClientDataIterator.from_bytes(first.to_bytes())
    assert restored == first
    assert [int(d.cardinality()) for d in restored.select(None)] == [10, 20, 30, 40]
    with pytest.raises(ValueError, match="k=5"):
        restored.select(5)
    assert source.federated_type == tff.FederatedType(tff.SequenceType(np.int64), tff.CLIENTS)


def test_client_data_source_serves_one_choice_per_round_of_a_cycle():
    """With `data_names` (RoLoRA's `next`: a B round and an A round), call c serves
    communication rounds 2c − 1 and 2c, each with its own seeded choice and data."""
    source = program.ClientDataSource(
        "cycle", lambda r: [tf.data.Dataset.range(100 * r + k) for k in range(4)], seed=5,
        data_names=("b_round", "a_round"))
    plain = program.ClientDataSource(
        "plain", lambda r: [tf.data.Dataset.range(100 * r + k) for k in range(4)], seed=5)
    cycle, rounds = source.iterator(), plain.iterator()
    for _ in range(3):
        chosen = cycle.select(2)
        assert list(chosen) == ["b_round", "a_round"]
        for name in chosen:  # the plain source's next round, the same seeded choice
            assert [int(d.cardinality()) for d in chosen[name]] == [
                int(d.cardinality()) for d in rounds.select(2)]
    assert cycle.rounds_served == 3 and rounds.rounds_served == 6
    sequence = tff.SequenceType(np.int64)
    assert source.federated_type == tff.FederatedType(
        tff.StructType([("b_round", sequence), ("a_round", sequence)]), tff.CLIENTS)
    with pytest.raises(ValueError, match="must be distinct names"):
        program.ClientDataSource("bad", [tf.data.Dataset.range(1)], data_names=("x", "x"))


def test_next_clients_names_the_clients_the_next_select_serves():
    """Positions in the population, recomputed from the seed: round r takes
    sorted(default_rng([seed, r]).choice(N, k)); with `data_names` one list per round of the
    call. Asking does not serve: the iterator's position stays."""
    sizes = (10, 20, 30, 40)
    source = program.ClientDataSource("ids", [tf.data.Dataset.range(n) for n in sizes], seed=3)
    cycle = program.ClientDataSource("ids_cycle", [tf.data.Dataset.range(n) for n in sizes],
                                     seed=3, data_names=("b_round", "a_round"))
    iterator, cycle_iterator = source.iterator(), cycle.iterator()

    def expected(round_num):
        rng = np.random.default_rng([3, round_num])
        return sorted(int(i) for i in rng.choice(len(sizes), size=2, replace=False))

    for call in range(1, 5):
        chosen = iterator.next_clients(2)
        assert chosen == iterator.next_clients(2) == expected(call)
        assert iterator.rounds_served == call - 1
        assert [int(d.cardinality()) for d in iterator.select(2)] == [sizes[i] for i in chosen]
        assert cycle_iterator.next_clients(2) == {"b_round": expected(2 * call - 1),
                                                  "a_round": expected(2 * call)}
        cycle_iterator.select(2)
    assert iterator.next_clients(None) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="k=5 clients requested from a population of 4"):
        iterator.next_clients(5)


def test_client_data_source_fresh_data_per_round_and_restore_errors():
    source = program.ClientDataSource(
        "fresh", lambda r: [tf.data.Dataset.range(100 * r + k) for k in range(3)], seed=0)
    iterator = source.iterator()
    assert [int(d.cardinality()) for d in iterator.select()] == [100, 101, 102]
    assert [int(d.cardinality()) for d in iterator.select()] == [200, 201, 202]

    saved = iterator.to_bytes()
    other = program.ClientDataSource("fresh", [tf.data.Dataset.range(1)], seed=1)  # replaces it
    with pytest.raises(ValueError, match="seed 1"):
        program.ClientDataIterator.from_bytes(saved)
    with pytest.raises(LookupError, match="no ClientDataSource named 'gone'"):
        program.ClientDataIterator.from_bytes(saved.replace(b'"fresh"', b'"gone"'))
    del other  # sources are held weakly: a dropped one is not found either
    with pytest.raises(LookupError, match="no ClientDataSource named 'fresh'"):
        program.ClientDataIterator.from_bytes(saved)


# --- the context ------------------------------------------------------------------------------

@tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
def _mean(values):
    return tff.federated_mean(values)


def test_program_runtime_installs_a_federated_context_and_cleans_up_on_error(tmp_path):
    before = context_stack_impl.context_stack.current
    with pytest.raises(RuntimeError, match="stop here"):
        with runtime.program_runtime(log_dir=tmp_path) as context:
            assert isinstance(context, tff.program.NativeFederatedContext)
            assert context_stack_impl.context_stack.current is context
            assert len(workers.running_workers()) == 1

            async def mean():
                return await tff.program.materialize_value(_mean([1.0, 2.0, 6.0]))

            assert asyncio.run(mean()) == pytest.approx(3.0)
            raise RuntimeError("stop here")
    assert context_stack_impl.context_stack.current is before
    assert workers.running_workers() == []
    assert (tmp_path / "tff_worker.log").exists()


# --- train_model, interrupted and resumed -----------------------------------------------------

def _train(process, state_dir, total_rounds, log_dir, source=None):
    """One program: `train_model` up to `total_rounds` in its own `program_runtime()`, on
    `source()` (default the Keras clients' datasets); returns (metrics released, model states
    released)."""
    metrics, models = tff.program.MemoryReleaseManager(), tff.program.MemoryReleaseManager()
    with runtime.program_runtime(log_dir=log_dir):
        asyncio.run(tff.learning.programs.train_model(
            train_process=process,
            train_data_source=(source or (lambda: _source(data_names=process.data_names)))(),
            train_per_round_clients=_PER_ROUND,
            train_total_rounds=total_rounds,
            program_state_manager=tff.program.FileProgramStateManager(str(state_dir)),
            model_output_manager=models,
            train_metrics_manager=metrics,
            evaluation_manager=None,
            evaluation_periodicity=1,
        ))
    assert workers.running_workers() == []
    return metrics.values(), models.values()


def _weights(state):
    weights = state.global_model_weights
    return [np.asarray(w) for w in list(weights.trainable) + list(weights.non_trainable)]


def _selected_examples(chosen) -> int:
    columns = chosen.values() if isinstance(chosen, dict) else [chosen]
    return sum(_size(d) for column in columns for d in column)


def _check_metrics(released, rounds, data_names=None):
    assert list(released) == list(rounds)
    iterator = _source(data_names=data_names).iterator()  # the same seeded clients, replayed
    for _ in range(rounds[0] - 1):
        iterator.select(_PER_ROUND)
    for round_num in rounds:
        metrics = released[round_num]
        # TFF's structure; train_model moves client_work/train to model_metrics.
        assert {"distributor", "client_work", "aggregator", "finalizer", "model_metrics"} <= set(
            metrics)
        # A cycle (RoLoRA: B round, then A round) trains on both rounds' clients.
        expected = _selected_examples(iterator.select(_PER_ROUND))
        assert int(metrics["model_metrics"]["num_examples"]) == expected
        assert np.isfinite(metrics["model_metrics"]["loss"])
        if data_names is not None:
            assert [bytes(k).decode() for k in metrics["finalizer"]["round_kind"]] == list(
                data_names)


# The personalized family's stateless algorithms (no personal state): FedAvg, FedAvg-FT.
_STATELESS_PERSONALIZED = ("fedavg", "fedavg_ft")


def _process(algorithm):
    if algorithm == "rolora_ffa":   # RoLoRA for rounds 0, 1 (B, A), then B rounds
        return lora_fl.build_rolora_then_ffa(0.5, 4, _model_fn, _SPEC, 0.1)
    if algorithm in _STATELESS_PERSONALIZED:
        process = personalized.build_personalized_process(algorithm, _model_fn, _SPEC, 0.1)
        assert process.personal is None
        return process
    return lora_fl.build_lora_process(algorithm, _model_fn, _SPEC, 0.1)


# The fast tier: RoLoRA (two round kinds); the large tier every algorithm.
@pytest.mark.parametrize("algorithm", tiered(
    (*lora_plans.FIXED_SCHEDULE_ALGORITHMS, "rolora_ffa", *_STATELESS_PERSONALIZED),
    fast=["rolora"]))
def test_train_model_resumes_to_the_uninterrupted_result(algorithm, tmp_path):
    process = _process(algorithm)
    assert isinstance(process, tff.learning.templates.LearningProcess)
    names = process.data_names

    metrics, models = _train(process, tmp_path / "whole", 4, tmp_path / "logs")
    _check_metrics(metrics, [1, 2, 3, 4], names)
    if algorithm == "rolora_ffa":   # the switch round's kind, chosen in-graph by round number
        assert [bytes(metrics[t]["finalizer"]["round_kind"]).decode() for t in (1, 2, 3, 4)] == [
            "b_round", "a_round", "b_round", "b_round"]
    whole = _weights(models["training_checkpoint_round_4"])

    first_metrics, first_models = _train(process, tmp_path / "resumed", 2, tmp_path / "logs")
    _check_metrics(first_metrics, [1, 2], names)
    halfway = _weights(first_models["training_checkpoint_round_2"])
    assert any(not np.allclose(a, b) for a, b in zip(halfway, whole))  # rounds 3, 4 train

    resumed_metrics, resumed_models = _train(process, tmp_path / "resumed", 4, tmp_path / "logs")
    _check_metrics(resumed_metrics, [3, 4], names)  # rounds 1, 2 are not run again
    resumed = _weights(resumed_models["training_checkpoint_round_4"])
    assert len(resumed) == len(whole)
    for got, want in zip(resumed, whole):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)

    versions = asyncio.run(
        tff.program.FileProgramStateManager(str(tmp_path / "resumed")).get_versions())
    assert versions == [0, 1, 2, 3, 4]


# --- the stateless linear algorithms: tensor client data, the same program --------------------

_LINEAR = {"fedrep_linear": lambda: fedrep_linear.build_fedrep_linear(_D, 2, 0.3, seed=1),
           "rolora_linear": lambda: rolora_linear.build_rolora_alt_min_gd(_D, 0.3, seed=1)}


def _linear_source(algorithm):
    """Three clients' `{x: (m_i, d), y}` arrays (m_i = `_SIZES`; RoLoRA's Alt-min-GD regresses
    y: (m_i, d)), served by `ClientDataSource` as tensors, not datasets."""
    rng = np.random.default_rng(0)
    clients = [collections.OrderedDict(
        x=rng.normal(size=(n, _D)).astype(np.float32),
        y=rng.normal(size=(n, _D) if algorithm == "rolora_linear" else n).astype(np.float32))
        for n in _SIZES]
    return program.ClientDataSource(f"train_{algorithm}", clients, seed=7)


def _leaves(state):
    return [np.asarray(v) for v in tf.nest.flatten(state)]


def _check_linear_metrics(released, rounds):
    assert list(released) == list(rounds)
    for round_num in rounds:
        metrics = released[round_num]
        # TFF's structure; train_model moves client_work/train to model_metrics.
        assert {"distributor", "client_work", "aggregator", "finalizer", "model_metrics"} <= set(
            metrics)
        assert int(metrics["model_metrics"]["num_clients"]) == _PER_ROUND
        assert np.isfinite(metrics["model_metrics"]["loss"])


@pytest.mark.parametrize("algorithm", tiered(list(_LINEAR), fast=["rolora_linear"]))
def test_train_model_runs_and_resumes_the_stateless_linear_algorithms(algorithm, tmp_path):
    process = _LINEAR[algorithm]()
    assert isinstance(process, tff.learning.templates.LearningProcess)
    for computation in (process.next, process.initialize, process.get_model_weights,
                        process.set_model_weights):
        assert isinstance(computation, tff.Computation)
    source = lambda: _linear_source(algorithm)  # noqa: E731  (built anew by each program)
    assert source().federated_type.member == process.next.type_signature.parameter[1].member

    metrics, models = _train(process, tmp_path / "whole", 4, tmp_path / "logs", source)
    _check_linear_metrics(metrics, [1, 2, 3, 4])
    whole = _leaves(models["training_checkpoint_round_4"])
    # train_model's round is one `next`: a cycle of communication rounds (Alt-min-GD: B, A).
    assert process.round_num(models["training_checkpoint_round_4"]) == 4 * len(process.cycle)

    first_metrics, first_models = _train(process, tmp_path / "resumed", 2, tmp_path / "logs",
                                         source)
    _check_linear_metrics(first_metrics, [1, 2])
    halfway = _leaves(first_models["training_checkpoint_round_2"])
    assert any(not np.allclose(a, b) for a, b in zip(halfway, whole))  # rounds 3, 4 train

    resumed_metrics, resumed_models = _train(process, tmp_path / "resumed", 4, tmp_path / "logs",
                                             source)
    _check_linear_metrics(resumed_metrics, [3, 4])  # rounds 1, 2 are not run again
    resumed = _leaves(resumed_models["training_checkpoint_round_4"])
    assert len(resumed) == len(whole)
    for got, want in zip(resumed, whole):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    for round_num in (3, 4):   # the resumed rounds saw the uninterrupted run's clients
        np.testing.assert_allclose(resumed_metrics[round_num]["model_metrics"]["loss"],
                                   metrics[round_num]["model_metrics"]["loss"], rtol=1e-6)

    versions = asyncio.run(
        tff.program.FileProgramStateManager(str(tmp_path / "resumed")).get_versions())
    assert versions == [0, 1, 2, 3, 4]
    assert workers.running_workers() == []


def test_the_rolora_program_in_docs_engine_md_runs_as_written(tmp_path, monkeypatch, capsys):
    """docs/engine.md's "Inside TFF's own programs" block, executed as written (in a temporary
    working directory, its run directory): 2 RoLoRA iterations, each a B round and an A round on
    both clients of 6 examples (24 examples)."""
    text = (pathlib.Path(__file__).parents[3] / "docs" / "engine.md").read_text()
    block = text.split("## Inside TFF's own programs")[1].split("```python\n")[1].split("```")[0]
    monkeypatch.chdir(tmp_path)
    exec(block, {"__name__": "docs_engine_md"})
    assert capsys.readouterr().out.strip().endswith("24.0 [b'b_round' b'a_round']")
    assert (tmp_path / "runs" / "rolora" / "state" / "program_state_2").is_dir()
    assert workers.running_workers() == []
