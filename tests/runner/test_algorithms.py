"""runner/algorithms: algorithm, optimizer and participation names -> tffl objects, and the
per-client evaluators."""

import numpy as np
import pytest

from runner import algorithms
from runner.run_config import ParticipationConfig
from runner.run_config import RunConfig
from tasks import registry
from tasks.task_config import TaskSpec


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
    task = registry.build_run_task(TaskSpec().with_changes(task="digits", num_clients=8, batch_size=4,
        local_steps=1, seed=0, partition="iid"))
    def sampler(**changes):
        return algorithms.build_sampler(task, ParticipationConfig(**changes), 0)

    srpfl = sampler(clients_per_round=8, participation="srpfl", initial_participants=2,
                    stage_rounds=3)
    assert [len(srpfl.sample(t).client_ids) for t in (1, 3, 4, 7)] == [2, 2, 4, 8]
    full = sampler(clients_per_round=3, participation="full", straggler="dynamic")
    assert len(full.sample(1).client_ids) == 8 and full.sample(2).info["simulated_time"] > 0
    assert len(sampler(clients_per_round=3).sample(1).client_ids) == 3
    with pytest.raises(ValueError, match="unknown participation 'some'"):
        sampler(clients_per_round=3, participation="some")
    with pytest.raises(ValueError, match="unknown straggler model 'slow'"):
        sampler(clients_per_round=3, participation="full", straggler="slow")
    with pytest.raises(ValueError, match="clients_per_round=9: the task has 8 clients"):
        sampler(clients_per_round=9)


@pytest.mark.large
def test_per_client_evaluation_pools_to_the_one_pass_metrics(tmp_path):
    """--eval_per_client evaluates each client once and pools: FedRep's personal loss, accuracy
    and mean client accuracy equal one TFF evaluation over all clients; FedAvg's per-client
    accuracies (global model, Keras) equal the TFF evaluation's per-client ones, and its pooled
    loss and accuracy equal the pooled test set's (the digits clients' test sets partition it);
    with the pooled size unknown, the pooled test set is read instead. A held-out split per
    client adds `personal_test_*`, computed like `personal_*`."""
    import dataclasses

    from tffl import runtime
    from tffl.simulation import driver

    task = registry.build_run_task(TaskSpec().with_changes(task="digits", num_clients=3, batch_size=16,
        local_steps=2, seed=1, net="pfl_mlp", partition="iid"))
    ids = task.client_ids
    assert task.global_test_size == sum(
        sum(1 for _ in d.unbatch()) for d in task.client_eval_data()[2])
    with runtime.local_runtime():
        for name in ("fedrep", "fedavg"):
            process = algorithms.build_algorithm(
                name, task, RunConfig().with_changes(learning_rate=0.5, head_epochs=1))
            result = driver.run_rounds(
                process, algorithms.build_sampler(task, ParticipationConfig(clients_per_round=3), 0),
                task.client_dataset_fn, 1,
                tmp_path / name, driver.RunOptions(log=None, tensorboard=False))
            store = result.personal_store
            one_pass = algorithms.personalized_evaluator(task, process)(result.state, store)
            personal = algorithms.per_client_evaluator(task, process, True)(result.state, store)
            accuracies = [personal.pop(f"{c}_accuracy") for c in ids]
            assert sorted(personal) == sorted(one_pass)
            for key, value in one_pass.items():
                assert personal[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
            assert np.mean(accuracies) == pytest.approx(
                one_pass["personal_mean_client_accuracy"], abs=1e-6)
            # A held-out split per client is evaluated like the test split: handed the same
            # data, `personal_test_*` equals `personal_*` in both evaluators.
            assert not any(k.startswith("personal_test_") for k in one_pass)
            twice = dataclasses.replace(task, client_heldout_data=task.client_eval_data)
            for evaluator in (algorithms.personalized_evaluator(twice, process),
                              algorithms.per_client_evaluator(twice, process, True)):
                both = evaluator(result.state, store)
                for key, value in one_pass.items():
                    if key.startswith("personal_"):
                        test_key = key.replace("personal_", "personal_test_")
                        assert both[test_key] == pytest.approx(value, rel=1e-5, abs=1e-6)
            if name == "fedavg":
                global_ = algorithms.per_client_evaluator(task, process, False)(result.state)
                for cid, value in zip(ids, accuracies):
                    assert global_[f"{cid}_accuracy"] == pytest.approx(value, abs=1e-6)
                pooled = task.evaluate(process.model_weights(result.state))
                for key in ("loss", "accuracy"):
                    assert global_[key] == pytest.approx(pooled[key], rel=1e-5, abs=1e-6)
                unknown = dataclasses.replace(task, global_test_size=None,
                                              evaluate=lambda w: {"loss": -1.0, "accuracy": -1.0})
                fallback = algorithms.per_client_evaluator(unknown, process, False)(result.state)
                assert (fallback["loss"], fallback["accuracy"]) == (-1.0, -1.0)
