"""experiments/algorithms: algorithm, optimizer and participation names -> tffl objects, and the
per-client evaluators."""

import numpy as np
import pytest

from experiments import algorithms
from tasks import registry


def test_personalized_wiring():
    assert algorithms.model_for("fedrep") == "pfl_mlp"
    assert algorithms.model_for("lg_fedavg") == "pfl_mlp_lg"
    assert algorithms.model_for("fedper", "lora_alternating") == "lora_head_net"


def test_optimizers_by_name():
    """The flags' optimizers are `tff.learning.optimizers`: one step of each on w = 1, g = 2
    gives the textbook update (SGD: w − ηg; momentum β: the same first step; Adam: the first
    step is w − η·sign(g), up to ε)."""
    import tensorflow as tf
    import tensorflow_federated as tff

    w, g = [tf.constant([1.0])], [tf.constant([2.0])]
    for name, momentum, expected in (("sgd", 0.0, 1.0 - 0.1 * 2.0), ("sgd", 0.9, 1.0 - 0.1 * 2.0),
                                     ("adam", 0.0, 1.0 - 0.1)):
        optimizer = algorithms.build_optimizer(name, 0.1, momentum)
        assert isinstance(optimizer, tff.learning.optimizers.Optimizer)
        state = optimizer.initialize([tf.TensorSpec([1], tf.float32)])
        _, new = optimizer.next(state, w, g)
        np.testing.assert_allclose(new[0].numpy(), [expected], rtol=1e-6)
    with pytest.raises(ValueError, match="unknown optimizer 'lion'"):
        algorithms.build_optimizer("lion", 0.1)
    with pytest.raises(ValueError, match="momentum applies to the sgd optimizer only"):
        algorithms.build_optimizer("adam", 0.1, 0.9)


def test_samplers_by_name():
    task = registry.build_task("digits", 8, 4, 1, 0)
    srpfl = algorithms.build_sampler(task, 8, 0, kind="srpfl", initial_participants=2,
                                   stage_rounds=3)
    assert [len(srpfl.sample(t).client_ids) for t in (1, 3, 4, 7)] == [2, 2, 4, 8]
    full = algorithms.build_sampler(task, 3, 0, kind="full", straggler="dynamic")
    assert len(full.sample(1).client_ids) == 8 and full.sample(2).info["simulated_time"] > 0
    assert len(algorithms.build_sampler(task, 3, 0).sample(1).client_ids) == 3
    with pytest.raises(ValueError, match="unknown participation 'some'"):
        algorithms.build_sampler(task, 3, 0, kind="some")
    with pytest.raises(ValueError, match="unknown straggler model 'slow'"):
        algorithms.build_sampler(task, 3, 0, kind="full", straggler="slow")


def test_per_client_accuracies_average_to_the_pooled_ones(tmp_path):
    """--eval_per_client: FedRep's per-client accuracies (each client with its own head) average
    to the TFF evaluation's mean client accuracy; FedAvg's global model evaluated per client by
    a Keras evaluator gives the same per-client numbers as the TFF evaluation of that model."""
    from tffl import runtime
    from tffl import simulation

    task = registry.build_task("digits", num_clients=3, batch_size=16, local_steps=2, seed=1,
                               model="pfl_mlp")
    ids = task.client_ids
    with runtime.local_runtime():
        for name in ("fedrep", "fedavg"):
            process = algorithms.build_algorithm(name, task, client_learning_rate=0.5)
            result = simulation.run_rounds(
                process, algorithms.build_sampler(task, 3, 0), task.client_dataset_fn, rounds=1,
                output_dir=tmp_path / name, log=None, tensorboard=False)
            store = result.personal_store
            pooled = algorithms.personalized_evaluator(task, process)(result.state, store)
            personal = algorithms.per_client_evaluator(task, process, True)(result.state, store)
            assert sorted(personal) == sorted(f"{c}_accuracy" for c in ids)
            assert np.mean(list(personal.values())) == pytest.approx(
                pooled["personal_mean_client_accuracy"], abs=1e-6)
            if name == "fedavg":
                global_ = algorithms.per_client_evaluator(task, process, False)(result.state)
                for key, value in personal.items():
                    assert global_[key] == pytest.approx(value, abs=1e-6)
