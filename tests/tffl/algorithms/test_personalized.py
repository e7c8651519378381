"""tffl.algorithms.personalized (+ the stateful-clients driver): FedRep, FedPer, LG-FedAvg, FedAvg, FedAvg-FT.

The model in the numpy checks is linear, f(x) = x·W·h with W (d×k, role `shared`) the
representation and h (k×1, role `head`) the personal head, loss L = mean_n (x_n W h − y_n)², so

    ∇_h L = (2/n) (XW)ᵀ r,   ∇_W L = (2/n) Xᵀ r hᵀ,   r = XWh − y,

and every client dataset is one full batch, so an epoch is one gradient step.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests.tffl.algorithms.personalized_models import (D, K, LR, SPEC, build, built, grads,
                                                       full_batch_datasets, initial_weights,
                                                       linear_clients, linear_model, numpy_round)
from tffl.algorithms import personalized
from tffl.engine import personal_state
from tffl.engine import roles
from tffl.simulation import checkpoint
from tffl.simulation import driver
from tffl.simulation import participation


def test_fedrep_two_rounds_equal_numpy_and_heads_carry_over(tff_runtime):
    """Round 2 must start each client's head from the head it returned in round 1."""
    process = build("fedrep", head_epochs=3, representation_epochs=2)
    clients = linear_clients()
    w, h0 = initial_weights(process)
    state = process.initialize()
    personal = [process.initialize_personal(str(i)) for i in range(3)]
    for p in personal:
        np.testing.assert_array_equal(p[0], h0)   # every client starts at the model's head
    heads = [h0] * 3
    for t in range(2):
        out = process.next(state, full_batch_datasets(clients), personal)
        state, personal = out.state, out.personal_states
        assert process.round_num(state) == t + 1
        w, heads = numpy_round("fedrep", clients, w, heads, tau_h=3, tau_r=2)
        got_w = process.get_model_weights(state).trainable[0]
        np.testing.assert_allclose(got_w, w, rtol=2e-5, atol=1e-6)
        np.testing.assert_array_equal(process.model_weights(state).trainable[0], got_w)
        for got, want in zip(personal, heads):
            np.testing.assert_allclose(got[0], want, rtol=2e-5, atol=1e-6)
    # The server never sees a head: the federated weights are W alone, and the whole model
    # assembled from the state still holds the initial head (a client's personal state
    # replaces it).
    federated = process.get_model_weights(state)
    assert [np.shape(v) for v in federated.trainable] == [(D, K)]
    assert list(federated.non_trainable) == []
    np.testing.assert_array_equal(process.model_weights(state).trainable[1], h0)
    np.testing.assert_array_equal(process.model_weights(state, personal[1]).trainable[1],
                                  personal[1][0])


@pytest.mark.parametrize("algorithm", ["fedper"])
def test_joint_local_training_equals_numpy(tff_runtime, algorithm):
    process = build(algorithm, local_epochs=2)
    clients = linear_clients(seed=1)
    w, h0 = initial_weights(process)
    out = process.next(process.initialize(), full_batch_datasets(clients),
                       [process.initialize_personal(str(i)) for i in range(3)])
    w1, heads = numpy_round(algorithm, clients, w, [h0] * 3, epochs=2)
    np.testing.assert_allclose(process.get_model_weights(out.state).trainable[0], w1,
                               rtol=2e-5, atol=1e-6)
    for got, want in zip(out.personal_states, heads):
        np.testing.assert_allclose(got[0], want, rtol=2e-5, atol=1e-6)


def test_fedrep_interleaved_blocks_equal_numpy(tff_runtime):
    """SRPFL's code runs FedRep as R blocks of (τ_h head epochs, τ_r representation epochs); with
    R = 2, τ_h = 2, τ_r = 1 the client's schedule is h, h, W, h, h, W (full batch)."""
    process = build("fedrep", head_epochs=2, representation_epochs=1, representation_blocks=2)
    clients = linear_clients(seed=6)
    w, h0 = initial_weights(process)
    out = process.next(process.initialize(), full_batch_datasets(clients),
                       [process.initialize_personal(str(i)) for i in range(3)])
    new_w, counts = [], []
    for (x, y), got in zip(clients, out.personal_states):
        x, y = x.astype(np.float64), y.astype(np.float64)
        wi, hi = w.copy(), h0.copy()
        for _ in range(2):
            for _ in range(2):
                hi = hi - LR * grads(x, y, wi, hi)[1]
            wi = wi - LR * grads(x, y, wi, hi)[0]
        np.testing.assert_allclose(got[0], hi, rtol=2e-5, atol=1e-6)
        new_w.append(wi)
        counts.append(len(x))
    w_bar = sum(c * wi for c, wi in zip(counts, new_w)) / sum(counts)
    np.testing.assert_allclose(process.get_model_weights(out.state).trainable[0], w_bar,
                               rtol=2e-5, atol=1e-6)
    with pytest.raises(ValueError, match="representation_blocks=2 interleaves"):
        build("fedper", representation_blocks=2)


def _lg_model():
    """LG-FedAvg's own split of the linear model: the lower layer `rep` is local (role head),
    the top layer `out` is global (role shared)."""
    model = linear_model()
    roles.tag_layer(model.get_layer("rep"), roles.HEAD)
    roles.tag_layer(model.get_layer("out"), roles.SHARED)
    return model


def test_lg_fedavg_keeps_its_lower_layer_local_and_averages_the_top(tff_runtime):
    """LG-FedAvg on its own split (srpfl.md §6.3): client i trains (W_i, h) jointly for E epochs
    from its own lower layer W_i and the global top h; the server averages the h_i by examples;
    W_i stays on the client. Two rounds, so round 2 starts from the kept W_i."""
    process = personalized.build_personalized_process(
        "lg_fedavg", _lg_model, SPEC, LR, loss_fn=tf.keras.losses.MeanSquaredError,
        local_epochs=2)
    clients = linear_clients(seed=4)
    weights = process.model_weights(process.initialize())
    w0, h = (np.asarray(v, np.float64) for v in weights.trainable)   # rep (D×K), out (K×1)
    personal = [process.initialize_personal(str(i)) for i in range(3)]
    for p in personal:
        np.testing.assert_array_equal(p[0], w0)   # the local layer starts at the model's
    state, ws = process.initialize(), [w0] * 3
    for _ in range(2):
        out = process.next(state, full_batch_datasets(clients), personal)
        state, personal = out.state, out.personal_states
        new_ws, new_hs, counts = [], [], []
        for (x, y), wi in zip(clients, ws):
            x, y = x.astype(np.float64), y.astype(np.float64)
            hi = h.copy()
            for _ in range(2):
                gw, gh = grads(x, y, wi, hi)
                wi, hi = wi - LR * gw, hi - LR * gh
            new_ws.append(wi)
            new_hs.append(hi)
            counts.append(len(x))
        h = sum(c * hi for c, hi in zip(counts, new_hs)) / sum(counts)
        ws = new_ws
        federated = process.get_model_weights(state).trainable
        assert len(federated) == 1 and np.shape(federated[0]) == (K, 1)   # only the top layer
        np.testing.assert_allclose(federated[0], h, rtol=2e-5, atol=1e-6)
        for got, want in zip(personal, ws):
            np.testing.assert_allclose(got[0], want, rtol=2e-5, atol=1e-6)


def test_fedavg_averages_everything_with_example_weights(tff_runtime):
    process = built("fedavg")
    assert process.personal is None
    assert isinstance(process, tff.learning.templates.LearningProcess)
    clients = linear_clients(seed=2)
    w, h = initial_weights(process)
    out = process.next(process.initialize(), full_batch_datasets(clients))
    local = []
    for x, y in clients:
        gw, gh = grads(x.astype(float), y.astype(float), w, h)
        local.append((w - LR * gw, h - LR * gh))
    n = np.array([len(x) for x, _ in clients], float)
    weights = process.get_model_weights(out.state)
    np.testing.assert_allclose(weights.trainable[0],
                               sum(c * a for c, (a, _) in zip(n, local)) / n.sum(), rtol=2e-5)
    np.testing.assert_allclose(weights.trainable[1],
                               sum(c * b for c, (_, b) in zip(n, local)) / n.sum(), rtol=2e-5)


def test_server_learning_rate_scales_the_mean_delta(tff_runtime):
    process = build("fedper", server_learning_rate=0.5)
    clients = linear_clients(seed=3)
    w, h0 = initial_weights(process)
    out = process.next(process.initialize(), full_batch_datasets(clients),
                       [process.initialize_personal("a")] * 3)
    w1, _ = numpy_round("fedper", clients, w, [h0] * 3)
    np.testing.assert_allclose(process.get_model_weights(out.state).trainable[0],
                               w + 0.5 * (w1 - w), rtol=2e-5, atol=1e-6)


def test_evaluation_uses_each_clients_head_and_fedavg_ft_finetunes(tff_runtime):
    """Personalized MSE of client i = mean (x W h_i − y)²; FedAvg-FT first takes E_ft head steps
    from the global head on the client's training batch."""
    clients, tests = linear_clients(seed=4), linear_clients(sizes=(6, 2, 4), seed=5)
    fedrep = built("fedrep")
    w, h0 = initial_weights(fedrep)
    heads = [h0 + 0.1 * i for i in range(3)]
    metrics = fedrep.evaluate(fedrep.initialize(), full_batch_datasets(clients),
                              full_batch_datasets(tests),
                              [[h.astype(np.float32)] for h in heads])
    errors = [np.sum((x @ w @ h - y) ** 2) for (x, y), h in zip(tests, heads)]
    n = sum(len(x) for x, _ in tests)
    assert metrics["loss"] == pytest.approx(sum(errors) / n, rel=1e-5)
    assert metrics["num_examples"] == n

    ft = build("fedavg_ft", finetune_epochs=3)
    w, h = initial_weights(ft)
    metrics = ft.evaluate(ft.initialize(), full_batch_datasets(clients), full_batch_datasets(tests))
    errors = []
    for (x, y), (xt, yt) in zip(clients, tests):
        hi = h.copy()
        for _ in range(3):
            hi = hi - LR * grads(x.astype(float), y.astype(float), w, hi)[1]
        errors.append(np.sum((xt @ w @ hi - yt) ** 2))
    assert metrics["loss"] == pytest.approx(sum(errors) / n, rel=1e-4)


def test_upload_holds_only_the_aggregated_variables():
    """FedRep and LG-FedAvg upload the representation deltas (d·k floats) + 3 metric floats + the
    weight; FedAvg also the head (k floats). Down is the federated weights only: FedRep's
    representation (d·k floats; the head stays on the client), FedAvg's representation and head."""
    assert personalized.METRIC_UPLOAD_BYTES == (3 + 1) * 4
    fedrep = built("fedrep")
    assert fedrep.traffic["round"].up == (D * K + 3 + 1) * 4
    assert built("lg_fedavg").traffic["round"].up == (D * K + 3 + 1) * 4
    assert built("fedavg").traffic["round"].up == (D * K + K + 3 + 1) * 4
    assert fedrep.traffic["round"].down == (D * K) * 4
    assert built("lg_fedavg").traffic["round"].down == (D * K) * 4
    assert built("fedavg").traffic["round"].down == (D * K + K) * 4
    # The weight goes up with unweighted aggregation too.
    unweighted = build("fedrep", aggregator=tff.aggregators.UnweightedMeanFactory())
    assert unweighted.traffic["round"].up == (D * K + 3 + 1) * 4


class _Scripted:
    """A sampler with a fixed list of clients per round."""

    def __init__(self, rounds):
        self.rounds = rounds

    def sample(self, round_num):
        return participation.Participation(list(self.rounds[round_num - 1]))


_SCHEDULE = [("a", "b"), ("b", "c"), ("a", "c"), ("b",)]


def _run(process, tmp_path, rounds, resume=False, name="run"):
    data = dict(zip("abc", linear_clients(sizes=(4, 6, 5), seed=7)))
    return driver.run_rounds(
        process, _Scripted(_SCHEDULE), lambda cid, t: full_batch_datasets([data[cid]])[0], rounds,
        tmp_path / name, driver.RunOptions(config={"test": 1}, resume=resume, log=None))


def test_heads_survive_rounds_without_their_client(tff_runtime, tmp_path):
    process = built("fedrep")
    result = _run(process, tmp_path, rounds=2)
    store = result.personal_store
    assert store.client_ids() == ["a", "b", "c"]
    # "a" trained in round 1 only; recompute its round-1 head independently.
    w, h0 = initial_weights(process)
    data = dict(zip("abc", linear_clients(sizes=(4, 6, 5), seed=7)))
    _, heads = numpy_round("fedrep", [data["a"], data["b"]], w, [h0, h0])
    np.testing.assert_allclose(store.get("a")[0], heads[0], rtol=2e-5, atol=1e-6)
    # A client that never trained gets the model's initial head.
    np.testing.assert_array_equal(store.get("z")[0], h0)
    # Round 3 trains "a" again, from its round-1 head (not from h0).
    result3 = _run(process, tmp_path, rounds=3, resume=True)
    assert not np.allclose(result3.personal_store.get("a")[0], store.get("a")[0])
    np.testing.assert_array_equal(result3.personal_store.get("b")[0], store.get("b")[0])


def test_personal_store_survives_checkpoint_and_resume(tff_runtime, tmp_path):
    process = built("fedrep")
    straight = _run(process, tmp_path, rounds=4, name="straight")
    _run(process, tmp_path, rounds=2, name="split")
    resumed = _run(build("fedrep"), tmp_path, rounds=4, resume=True, name="split")
    assert resumed.first_round == 3
    for cid in "abc":
        np.testing.assert_array_equal(resumed.personal_store.get(cid)[0],
                                      straight.personal_store.get(cid)[0])
    for got, want in zip(tf.nest.flatten(resumed.state), tf.nest.flatten(straight.state)):
        np.testing.assert_array_equal(got, want)
    # The checkpoint itself holds every client's head.
    _, path = checkpoint.latest(tmp_path / "split" / "checkpoints")
    _, extra, _ = checkpoint.load(path, template=process.initialize())
    assert sorted(extra) == ["a/0000", "b/0000", "c/0000"]


def test_resume_with_another_head_shape_is_refused(tff_runtime, tmp_path):
    process = built("fedrep")
    _run(process, tmp_path, rounds=1, name="r")
    store = personal_state.PersonalStore(lambda cid: [np.zeros((K + 1, 1), np.float32)])
    _, path = checkpoint.latest(tmp_path / "r" / "checkpoints")
    _, extra, _ = checkpoint.load(path, template=process.initialize())
    with pytest.raises(ValueError, match="checkpoint shape"):
        store.load_arrays(extra)


def test_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match="needs personal variables"):
        personalized.build_personalized_process(
            "fedrep", lambda: linear_model(head=False), SPEC, LR)
    with pytest.raises(ValueError, match="needs a representation"):
        personalized.build_personalized_process(
            "fedper", lambda: linear_model(representation=False), SPEC, LR)
    for kwargs, match in [({"head_epochs": 0}, "head_epochs"),
                          ({"representation_epochs": -1}, "representation_epochs"),
                          ({"local_epochs": 0}, "local_epochs"),
                          ({"finetune_epochs": -1}, "finetune_epochs"),
                          ({"lora_schedule": "zigzag"}, "lora_schedule"),
                          ({"server_learning_rate": 0.0}, "server_learning_rate")]:
        with pytest.raises(ValueError, match=match):
            build("fedrep", **kwargs)
    with pytest.raises(ValueError, match="unknown personalized algorithm 'fedx'"):
        build("fedx")
    with pytest.raises(ValueError, match="fedavg_ft"):
        build("fedavg", finetune_epochs=2)
    with pytest.raises(ValueError, match="lora_a/lora_b"):
        build("fedrep", lora_schedule="alternating")


def test_mismatched_personal_states_raise(tff_runtime):
    """`next_round` (what the driver calls) checks the personal states before TFF sees them;
    `next` is the bare `tff.Computation`, which TFF's own type check guards."""
    process = built("fedrep")
    assert isinstance(process.next, tff.Computation)
    datasets = full_batch_datasets(linear_clients())
    with pytest.raises(ValueError, match="3 client datasets but 2 personal states"):
        process.next_round(process.initialize(), datasets, [process.initialize_personal("a")] * 2)
    with pytest.raises(ValueError, match=r"must have shape \(2, 1\)"):
        process.next_round(process.initialize(), datasets, [[np.zeros((3, 1), np.float32)]] * 3)
