"""tffl.algorithms.personalized (+ the stateful-clients driver): FedRep, FedPer, LG-FedAvg, FedAvg, FedAvg-FT.

The model in the numpy checks is linear, f(x) = x·W·h with W (d×k, role `shared`) the
representation and h (k×1, role `head`) the personal head, loss L = mean_n (x_n W h − y_n)², so

    ∇_h L = (2/n) (XW)ᵀ r,   ∇_W L = (2/n) Xᵀ r hᵀ,   r = XWh − y,

and every client dataset is one full batch, so an epoch is one gradient step.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests.tffl.algorithms import eager_reference
from tffl.simulation import checkpoint
from tffl.simulation import participation
from tffl.engine import personal_state
from tffl.algorithms import personalized
from tffl.engine import roles
from tffl.simulation import driver as simulation

D, K = 4, 2
SPEC = (tf.TensorSpec([None, D], tf.float32), tf.TensorSpec([None, 1], tf.float32))
LR = 0.05


def _linear_model(head=True, representation=True):
    inputs = tf.keras.Input((D,))
    rep = tf.keras.layers.Dense(K, use_bias=False, name="rep",
                                kernel_initializer=tf.keras.initializers.GlorotUniform(1))
    out = tf.keras.layers.Dense(1, use_bias=False, name="out",
                                kernel_initializer=tf.keras.initializers.GlorotUniform(2))
    model = tf.keras.Model(inputs, out(rep(inputs)))
    if representation:
        roles.tag_layer(rep, roles.SHARED)
    else:
        rep.trainable = False
        roles.tag_layer(rep, roles.FROZEN)
    if head:
        roles.tag_layer(out, roles.HEAD)
    return model


def _build(algorithm, **kwargs):
    return personalized.build_personalized_process(
        algorithm, _linear_model, SPEC, LR, loss_fn=tf.keras.losses.MeanSquaredError, **kwargs)


def _clients(sizes=(5, 8, 3), seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(n, D)).astype(np.float32), rng.normal(size=(n, 1)).astype(np.float32))
            for n in sizes]


def _datasets(clients):
    return [tf.data.Dataset.from_tensor_slices((x, y)).batch(len(x)) for x, y in clients]


def _grads(x, y, w, h):
    r = x @ w @ h - y
    n = len(x)
    return 2 / n * x.T @ r @ h.T, 2 / n * (x @ w).T @ r


def _numpy_round(algorithm, clients, w, heads, tau_h=1, tau_r=1, epochs=1):
    """One round in float64: (new W, new heads, client losses of the last phase)."""
    new_w, new_heads, counts = [], [], []
    for (x, y), h in zip(clients, heads):
        x, y = x.astype(np.float64), y.astype(np.float64)
        wi, hi = w.copy(), h.copy()
        if algorithm == "fedrep":
            for _ in range(tau_h):
                hi = hi - LR * _grads(x, y, wi, hi)[1]
            for _ in range(tau_r):
                wi = wi - LR * _grads(x, y, wi, hi)[0]
        else:  # joint (FedPer, LG-FedAvg, FedAvg)
            for _ in range(epochs):
                gw, gh = _grads(x, y, wi, hi)
                wi, hi = wi - LR * gw, hi - LR * gh
        new_w.append(wi)
        new_heads.append(hi)
        counts.append(len(x))
    counts = np.array(counts, float)
    w_bar = w + sum(c * (wi - w) for c, wi in zip(counts, new_w)) / counts.sum()
    return w_bar, new_heads


def _initial(process):
    """(W, h) of the whole initial model (`model_weights`: the federated W, and the model's
    initial head at the personal position for the processes that keep the head personal)."""
    weights = process.model_weights(process.initialize())
    return np.asarray(weights.trainable[0], np.float64), np.asarray(weights.trainable[1],
                                                                    np.float64)


def test_fedrep_two_rounds_equal_numpy_and_heads_carry_over(tff_runtime):
    """Round 2 must start each client's head from the head it returned in round 1."""
    process = _build("fedrep", head_epochs=3, representation_epochs=2)
    clients = _clients()
    w, h0 = _initial(process)
    state = process.initialize()
    personal = [process.initialize_personal(str(i)) for i in range(3)]
    for p in personal:
        np.testing.assert_array_equal(p[0], h0)   # every client starts at the model's head
    heads = [h0] * 3
    for t in range(2):
        out = process.next(state, _datasets(clients), personal)
        state, personal = out.state, out.personal_states
        assert process.round_num(state) == t + 1
        w, heads = _numpy_round("fedrep", clients, w, heads, tau_h=3, tau_r=2)
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
    process = _build(algorithm, local_epochs=2)
    clients = _clients(seed=1)
    w, h0 = _initial(process)
    out = process.next(process.initialize(), _datasets(clients),
                       [process.initialize_personal(str(i)) for i in range(3)])
    w1, heads = _numpy_round(algorithm, clients, w, [h0] * 3, epochs=2)
    np.testing.assert_allclose(process.get_model_weights(out.state).trainable[0], w1,
                               rtol=2e-5, atol=1e-6)
    for got, want in zip(out.personal_states, heads):
        np.testing.assert_allclose(got[0], want, rtol=2e-5, atol=1e-6)


def test_fedrep_interleaved_blocks_equal_numpy(tff_runtime):
    """SRPFL's code runs FedRep as R blocks of (τ_h head epochs, τ_r representation epochs); with
    R = 2, τ_h = 2, τ_r = 1 the client's schedule is h, h, W, h, h, W (full batch)."""
    process = _build("fedrep", head_epochs=2, representation_epochs=1, representation_blocks=2)
    clients = _clients(seed=6)
    w, h0 = _initial(process)
    out = process.next(process.initialize(), _datasets(clients),
                       [process.initialize_personal(str(i)) for i in range(3)])
    new_w, counts = [], []
    for (x, y), got in zip(clients, out.personal_states):
        x, y = x.astype(np.float64), y.astype(np.float64)
        wi, hi = w.copy(), h0.copy()
        for _ in range(2):
            for _ in range(2):
                hi = hi - LR * _grads(x, y, wi, hi)[1]
            wi = wi - LR * _grads(x, y, wi, hi)[0]
        np.testing.assert_allclose(got[0], hi, rtol=2e-5, atol=1e-6)
        new_w.append(wi)
        counts.append(len(x))
    w_bar = sum(c * wi for c, wi in zip(counts, new_w)) / sum(counts)
    np.testing.assert_allclose(process.get_model_weights(out.state).trainable[0], w_bar,
                               rtol=2e-5, atol=1e-6)
    with pytest.raises(ValueError, match="representation_blocks=2 interleaves"):
        _build("fedper", representation_blocks=2)


def _lg_model():
    """LG-FedAvg's own split of the linear model: the lower layer `rep` is local (role head),
    the top layer `out` is global (role shared)."""
    model = _linear_model()
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
    clients = _clients(seed=4)
    weights = process.model_weights(process.initialize())
    w0, h = (np.asarray(v, np.float64) for v in weights.trainable)   # rep (D×K), out (K×1)
    personal = [process.initialize_personal(str(i)) for i in range(3)]
    for p in personal:
        np.testing.assert_array_equal(p[0], w0)   # the local layer starts at the model's
    state, ws = process.initialize(), [w0] * 3
    for _ in range(2):
        out = process.next(state, _datasets(clients), personal)
        state, personal = out.state, out.personal_states
        new_ws, new_hs, counts = [], [], []
        for (x, y), wi in zip(clients, ws):
            x, y = x.astype(np.float64), y.astype(np.float64)
            hi = h.copy()
            for _ in range(2):
                gw, gh = _grads(x, y, wi, hi)
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
    process = _build("fedavg")
    assert process.personal is None
    assert isinstance(process, tff.learning.templates.LearningProcess)
    clients = _clients(seed=2)
    w, h = _initial(process)
    out = process.next(process.initialize(), _datasets(clients))
    local = []
    for x, y in clients:
        gw, gh = _grads(x.astype(float), y.astype(float), w, h)
        local.append((w - LR * gw, h - LR * gh))
    n = np.array([len(x) for x, _ in clients], float)
    weights = process.get_model_weights(out.state)
    np.testing.assert_allclose(weights.trainable[0],
                               sum(c * a for c, (a, _) in zip(n, local)) / n.sum(), rtol=2e-5)
    np.testing.assert_allclose(weights.trainable[1],
                               sum(c * b for c, (_, b) in zip(n, local)) / n.sum(), rtol=2e-5)


def test_server_learning_rate_scales_the_mean_delta(tff_runtime):
    process = _build("fedper", server_learning_rate=0.5)
    clients = _clients(seed=3)
    w, h0 = _initial(process)
    out = process.next(process.initialize(), _datasets(clients),
                       [process.initialize_personal("a")] * 3)
    w1, _ = _numpy_round("fedper", clients, w, [h0] * 3)
    np.testing.assert_allclose(process.get_model_weights(out.state).trainable[0],
                               w + 0.5 * (w1 - w), rtol=2e-5, atol=1e-6)


def test_evaluation_uses_each_clients_head_and_fedavg_ft_finetunes(tff_runtime):
    """Personalized MSE of client i = mean (x W h_i − y)²; FedAvg-FT first takes E_ft head steps
    from the global head on the client's training batch."""
    clients, tests = _clients(seed=4), _clients(sizes=(6, 2, 4), seed=5)
    fedrep = _build("fedrep")
    w, h0 = _initial(fedrep)
    heads = [h0 + 0.1 * i for i in range(3)]
    metrics = fedrep.evaluate(fedrep.initialize(), _datasets(clients), _datasets(tests),
                              [[h.astype(np.float32)] for h in heads])
    errors = [np.sum((x @ w @ h - y) ** 2) for (x, y), h in zip(tests, heads)]
    n = sum(len(x) for x, _ in tests)
    assert metrics["loss"] == pytest.approx(sum(errors) / n, rel=1e-5)
    assert metrics["num_examples"] == n

    ft = _build("fedavg_ft", finetune_epochs=3)
    w, h = _initial(ft)
    metrics = ft.evaluate(ft.initialize(), _datasets(clients), _datasets(tests))
    errors = []
    for (x, y), (xt, yt) in zip(clients, tests):
        hi = h.copy()
        for _ in range(3):
            hi = hi - LR * _grads(x.astype(float), y.astype(float), w, hi)[1]
        errors.append(np.sum((xt @ w @ hi - yt) ** 2))
    assert metrics["loss"] == pytest.approx(sum(errors) / n, rel=1e-4)


def test_upload_holds_only_the_aggregated_variables():
    """FedRep and LG-FedAvg upload the representation deltas (d·k floats) + 3 metric floats + the
    weight; FedAvg also the head (k floats). Down is the federated weights only: FedRep's
    representation (d·k floats; the head stays on the client), FedAvg's representation and head."""
    assert personalized.METRIC_UPLOAD_BYTES == (3 + 1) * 4
    fedrep = _build("fedrep")
    assert fedrep.traffic["round"].up == (D * K + 3 + 1) * 4
    assert _build("lg_fedavg").traffic["round"].up == (D * K + 3 + 1) * 4
    assert _build("fedavg").traffic["round"].up == (D * K + K + 3 + 1) * 4
    assert fedrep.traffic["round"].down == (D * K) * 4
    assert _build("lg_fedavg").traffic["round"].down == (D * K) * 4
    assert _build("fedavg").traffic["round"].down == (D * K + K) * 4
    # The weight goes up with unweighted aggregation too.
    unweighted = _build("fedrep", aggregator=tff.aggregators.UnweightedMeanFactory())
    assert unweighted.traffic["round"].up == (D * K + 3 + 1) * 4


class _Scripted:
    """A sampler with a fixed list of clients per round."""

    def __init__(self, rounds):
        self.rounds = rounds

    def sample(self, round_num):
        return participation.Participation(list(self.rounds[round_num - 1]))


_SCHEDULE = [("a", "b"), ("b", "c"), ("a", "c"), ("b",)]


def _run(process, tmp_path, rounds, resume=False, name="run"):
    data = dict(zip("abc", _clients(sizes=(4, 6, 5), seed=7)))
    return simulation.run_rounds(
        process, _Scripted(_SCHEDULE), lambda cid, t: _datasets([data[cid]])[0], rounds=rounds,
        output_dir=tmp_path / name, config={"test": 1}, resume=resume, log=None)


def test_heads_survive_rounds_without_their_client(tff_runtime, tmp_path):
    process = _build("fedrep")
    result = _run(process, tmp_path, rounds=2)
    store = result.personal_store
    assert store.client_ids() == ["a", "b", "c"]
    # "a" trained in round 1 only; recompute its round-1 head independently.
    w, h0 = _initial(process)
    data = dict(zip("abc", _clients(sizes=(4, 6, 5), seed=7)))
    _, heads = _numpy_round("fedrep", [data["a"], data["b"]], w, [h0, h0])
    np.testing.assert_allclose(store.get("a")[0], heads[0], rtol=2e-5, atol=1e-6)
    # A client that never trained gets the model's initial head.
    np.testing.assert_array_equal(store.get("z")[0], h0)
    # Round 3 trains "a" again, from its round-1 head (not from h0).
    result3 = _run(process, tmp_path, rounds=3, resume=True)
    assert not np.allclose(result3.personal_store.get("a")[0], store.get("a")[0])
    np.testing.assert_array_equal(result3.personal_store.get("b")[0], store.get("b")[0])


def test_personal_store_survives_checkpoint_and_resume(tff_runtime, tmp_path):
    process = _build("fedrep")
    straight = _run(process, tmp_path, rounds=4, name="straight")
    _run(process, tmp_path, rounds=2, name="split")
    resumed = _run(_build("fedrep"), tmp_path, rounds=4, resume=True, name="split")
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
    process = _build("fedrep")
    _run(process, tmp_path, rounds=1, name="r")
    store = personal_state.PersonalStore(lambda cid: [np.zeros((K + 1, 1), np.float32)])
    _, path = checkpoint.latest(tmp_path / "r" / "checkpoints")
    _, extra, _ = checkpoint.load(path, template=process.initialize())
    with pytest.raises(ValueError, match="checkpoint shape"):
        store.load_arrays(extra)


def test_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match="needs personal variables"):
        personalized.build_personalized_process(
            "fedrep", lambda: _linear_model(head=False), SPEC, LR)
    with pytest.raises(ValueError, match="needs a representation"):
        personalized.build_personalized_process(
            "fedper", lambda: _linear_model(representation=False), SPEC, LR)
    for kwargs, match in [({"head_epochs": 0}, "head_epochs"),
                          ({"representation_epochs": -1}, "representation_epochs"),
                          ({"local_epochs": 0}, "local_epochs"),
                          ({"finetune_epochs": -1}, "finetune_epochs"),
                          ({"lora_schedule": "zigzag"}, "lora_schedule"),
                          ({"server_learning_rate": 0.0}, "server_learning_rate")]:
        with pytest.raises(ValueError, match=match):
            _build("fedrep", **kwargs)
    with pytest.raises(ValueError, match="unknown personalized algorithm 'fedx'"):
        _build("fedx")
    with pytest.raises(ValueError, match="fedavg_ft"):
        _build("fedavg", finetune_epochs=2)
    with pytest.raises(ValueError, match="lora_a/lora_b"):
        _build("fedrep", lora_schedule="alternating")


def test_mismatched_personal_states_raise(tff_runtime):
    """`next_round` (what the driver calls) checks the personal states before TFF sees them;
    `next` is the bare `tff.Computation`, which TFF's own type check guards."""
    process = _build("fedrep")
    assert isinstance(process.next, tff.Computation)
    datasets = _datasets(_clients())
    with pytest.raises(ValueError, match="3 client datasets but 2 personal states"):
        process.next_round(process.initialize(), datasets, [process.initialize_personal("a")] * 2)
    with pytest.raises(ValueError, match=r"must have shape \(2, 1\)"):
        process.next_round(process.initialize(), datasets, [[np.zeros((3, 1), np.float32)]] * 3)


def _lora_classifier():
    from models import backbones
    from models import lora_targets

    backbone = backbones.build_bert_backbone(vocabulary_size=50, num_layers=1, hidden_dim=8,
                                             intermediate_dim=16, max_sequence_length=8)
    lora_targets.apply_lora(backbone, lora_targets.LoraConfig(rank=2, targets=("query", "value")))
    lora_targets.freeze_non_lora(backbone)
    return backbones.build_classifier(backbone, num_classes=3)


def _reference_fedrep_round(model_fn, weights, heads, head_idx, rep_idx, datasets, lr):
    """FedRep's round written from the paper in eager TensorFlow (`eager_reference`): each
    client loads the weights and its head, takes one SGD epoch on the head, then one on the
    `rep_idx` variables; returns every client's trained trainable values (numpy)."""
    model = model_fn()
    out = []
    for dataset, head in zip(datasets, heads):
        values = list(weights.trainable)
        for k, v in zip(head_idx, head):
            values[k] = v
        out.append(eager_reference.sgd_phases(model, values, weights.non_trainable,
                                              (head_idx, rep_idx), dataset, lr))
    return out


def test_fedrep_heads_over_rolora_alternating_lora_on_a_kerasnlp_backbone(tff_runtime):
    """The combination the papers never ran: FedRep heads, LoRA adapters on a KerasNLP BERT
    representation, averaged RoLoRA-style. In the B round A is fixed and B is averaged; in the
    A round the reverse; every client's head is trained and kept personal. Both rounds' factors
    and heads equal an eager-TensorFlow FedRep written from the paper (its own SGD loop)."""
    x_spec = collections.OrderedDict(
        padding_mask=tf.TensorSpec([None, 8], tf.int32),
        segment_ids=tf.TensorSpec([None, 8], tf.int32),
        token_ids=tf.TensorSpec([None, 8], tf.int32))
    spec = (x_spec, tf.TensorSpec([None], tf.int32))
    process = personalized.build_personalized_process(
        "fedrep", _lora_classifier, spec, 0.5, lora_schedule="alternating")
    assert list(process.rounds) == ["b_round", "a_round"]
    info = process.spec.trainable
    a_idx = process.spec.indices([roles.LORA_A])
    b_idx = process.spec.indices([roles.LORA_B])
    head = process.evaluation.personal_indices
    assert {info[k].role for k in head} == {roles.HEAD}
    # The federated weights are the LoRA factors (the head is personal, the rest frozen).
    assert sorted(process.model.layout.trainable) == sorted(a_idx + b_idx)
    # Each round uploads one factor of every adapter: half of the factors' bytes; both rounds
    # receive both factors.
    factor_bytes = {name: sum(4 * np.prod(info[k].shape) for k in idx)
                    for name, idx in (("b_round", b_idx), ("a_round", a_idx))}
    for name in ("b_round", "a_round"):
        assert process.traffic[name].up == factor_bytes[name] + 16
        assert process.traffic[name].down == factor_bytes["b_round"] + factor_bytes["a_round"]

    def dataset(seed):
        r = np.random.default_rng(seed)
        x = collections.OrderedDict(
            padding_mask=np.ones((6, 8), np.int32), segment_ids=np.zeros((6, 8), np.int32),
            token_ids=r.integers(1, 50, (6, 8)).astype(np.int32))
        return tf.data.Dataset.from_tensor_slices((x, r.integers(0, 3, 6).astype(np.int32))
                                                  ).batch(3)

    datasets = [dataset(s) for s in (1, 2)]
    # Start from B ≠ 0 (as after some training): with B = 0 an A step is exactly zero, and in
    # this tiny random network one B round moves B by only ~1e-6.
    state = process.initialize()
    weights = process.model_weights(state)
    rng = np.random.default_rng(0)
    trainable = [rng.normal(0, 0.3, w.shape).astype(np.float32) if k in b_idx else w
                 for k, w in enumerate(weights.trainable)]
    state = process.with_model_weights(state, tff.learning.models.ModelWeights(
        trainable, list(weights.non_trainable)))
    before = process.model_weights(state).trainable
    for k in b_idx:
        np.testing.assert_array_equal(before[k], trainable[k])
    # One call of `next_round` is one communication round: first a B round, then an A round.
    assert process.round_name(state) == "b_round"
    b_only = process.next_round(state, datasets, [process.initialize_personal("x")] * 2)
    assert list(b_only.metrics) == ["b_round"]
    assert process.round_num(b_only.state) == 1
    after_b = process.model_weights(b_only.state).trainable
    for k in a_idx:
        np.testing.assert_array_equal(after_b[k], before[k])
    assert any(not np.array_equal(after_b[k], before[k]) for k in b_idx)
    heads = b_only.personal_states
    assert not np.array_equal(heads[0][0], heads[1][0])   # personal, not averaged
    assert np.isfinite(b_only.metrics["b_round"]["client_work"]["train"]["loss"])
    assert process.round_name(b_only.state) == "a_round"
    out = process.next_round(b_only.state, datasets, heads)
    assert list(out.metrics) == ["a_round"]
    assert process.round_num(out.state) == 2
    after = process.model_weights(out.state).trainable
    assert any(not np.array_equal(after[k], after_b[k]) for k in a_idx)
    for k in b_idx:   # the reverse: B is fixed in the A round
        np.testing.assert_array_equal(after[k], after_b[k])
    # The heads never reach the server: its weights assemble with the model's initial head.
    np.testing.assert_array_equal(after[head[0]], before[head[0]])
    assert not np.array_equal(out.personal_states[0][0], out.personal_states[1][0])
    assert np.isfinite(out.metrics["a_round"]["client_work"]["train"]["loss"])
    assert process.round_name(out.state) == "b_round"

    # The numbers: the B round, then the A round, against the eager reference (equal client
    # sizes, so the example-weighted mean is the plain mean). The moves are compared, relative
    # to their size, since a round moves the factors little.
    def assert_moved_alike(got, start, expected):
        move, expected_move = np.asarray(got) - start, np.asarray(expected) - start
        assert np.abs(expected_move).max() > 0
        np.testing.assert_allclose(move, expected_move, rtol=0,
                                   atol=1e-3 * np.abs(expected_move).max())

    full = process.model_weights(state)
    initial_heads = [[full.trainable[k] for k in head]] * 2
    ref_b = _reference_fedrep_round(_lora_classifier, full, initial_heads, head, b_idx,
                                    datasets, 0.5)
    for k in b_idx:
        assert_moved_alike(after_b[k], before[k], np.mean([c[k] for c in ref_b], axis=0))
    for client, personal in zip(ref_b, heads):
        for k, value in zip(head, personal):
            assert_moved_alike(value, full.trainable[k], client[k])
    ref_a = _reference_fedrep_round(_lora_classifier, process.model_weights(b_only.state),
                                    heads, head, a_idx, datasets, 0.5)
    for k in a_idx:
        assert_moved_alike(after[k], after_b[k], np.mean([c[k] for c in ref_a], axis=0))
    for client, personal, start in zip(ref_a, out.personal_states, heads):
        for k, value, initial in zip(head, personal, start):
            assert_moved_alike(value, initial, client[k])


# ---- FLUTE (deep, Algorithm 2) and AdaptPFL (deep) -------------------------------------------

M = 3  # classes


def _numpy_nc(h, u):
    """Independent numpy NC_i(H) = ‖HᵀH/‖HᵀH‖_F − (1/√(m−1)) (uuᵀ) ⊙ (I − 11ᵀ/m)‖_F."""
    m = h.shape[1]
    gram = h.T @ h
    gram = gram / np.sqrt(np.sum(gram**2) + 1e-12)
    target = np.outer(u, u) * (np.eye(m) - np.ones((m, m)) / m) / np.sqrt(m - 1)
    return np.sqrt(np.sum((gram - target) ** 2) + 1e-12)


def test_neural_collapse_matches_numpy_vanishes_at_the_etf_and_has_the_right_gradient():
    rng = np.random.default_rng(0)
    h = rng.normal(size=(4, M))
    u = np.array([1.0, 0.0, 1.0])
    assert float(personalized.neural_collapse(h, u)) == pytest.approx(_numpy_nc(h, u), rel=1e-10)
    # A 3-class simplex ETF (120° apart) with every class present is a zero of NC.
    angles = 2 * np.pi * np.arange(M) / M
    etf = np.stack([np.cos(angles), np.sin(angles)])
    assert float(personalized.neural_collapse(etf, np.ones(M))) < 1e-5
    # Gradient against central finite differences of the numpy formula.
    var = tf.Variable(h)
    with tf.GradientTape() as tape:
        value = personalized.neural_collapse(var, u)
    grad = tape.gradient(value, var).numpy()
    eps, numeric = 1e-6, np.zeros_like(h)
    for idx in np.ndindex(*h.shape):
        step = np.zeros_like(h)
        step[idx] = eps
        numeric[idx] = (_numpy_nc(h + step, u) - _numpy_nc(h - step, u)) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-8)


def _classifier(shortcut_alpha=None):
    """x (D) -> features x·W (K, role shared) -> logits = features·H + b (M, role head)."""
    inputs = tf.keras.Input((D,))
    rep = tf.keras.layers.Dense(K, use_bias=False, name="rep",
                                kernel_initializer=tf.keras.initializers.GlorotUniform(1))
    head = tf.keras.layers.Dense(M, name="head",
                                 kernel_initializer=tf.keras.initializers.GlorotUniform(2))
    logits = head(rep(inputs))
    roles.tag_layer(rep, roles.SHARED)
    roles.tag_layer(head, roles.HEAD)
    if shortcut_alpha is not None:
        from models import paper_models

        shortcut = tf.keras.layers.Dense(M, use_bias=False, name="shortcut",
                                         kernel_initializer="zeros")
        logits = paper_models.ShortcutMix(shortcut_alpha)([logits, shortcut(inputs)])
        roles.tag_layer(shortcut, roles.SHORTCUT)
    return tf.keras.Model(inputs, logits)


CLASS_SPEC = (tf.TensorSpec([None, D], tf.float32), tf.TensorSpec([None], tf.int32))


def _class_clients(seed, sizes=(6, 5)):
    rng = np.random.default_rng(seed)
    # Client 0 holds classes {0, 1}, client 1 classes {1, 2}.
    return [(rng.normal(size=(n, D)).astype(np.float32),
             (rng.integers(0, 2, n) + i).astype(np.int32)) for i, n in enumerate(sizes)]


def _class_datasets(clients):
    return [tf.data.Dataset.from_tensor_slices((x, y)).batch(len(x)) for x, y in clients]


def _numeric_grad(f, params, name, eps=1e-6):
    value = params[name]
    grad = np.zeros_like(value)
    for idx in np.ndindex(*value.shape):
        up = dict(params)
        down = dict(params)
        step = np.zeros_like(value)
        step[idx] = eps
        up[name], down[name] = value + step, value - step
        grad[idx] = (f(up) - f(down)) / (2 * eps)
    return grad


@pytest.mark.parametrize("variant, reduction", [("star", "mean"), ("plain", "sum")])
def test_flute_round_equals_finite_difference_numpy(variant, reduction):
    """One FLUTE* round (head epoch, joint epoch, the server's step of η_r on the mean NC of the
    round's heads, mean of W) against numpy, with every gradient taken by central finite
    differences of the numpy objectives; then the code's final round: every client fine-tunes
    its head for 2 epochs on the FLUTE objective (W fixed) and is tested."""
    cfg = personalized.FluteConfig(feature_penalty=0.05, head_penalty=0.02, nc_penalty=0.3,
                                   nc_step=0.4, variant=variant, feature_reduction=reduction,
                                   final_head_epochs=2)
    tests = _class_clients(seed=12, sizes=(4, 7))
    process = personalized.build_personalized_process("flute", _classifier, CLASS_SPEC, LR,
                                                      flute=cfg)
    clients = _class_clients(seed=11)
    from tffl import runtime

    with runtime.local_runtime():
        state = process.initialize()
        weights = process.model_weights(state)
        out = process.next(state, _class_datasets(clients),
                           [process.initialize_personal(c) for c in "ab"])
        federated = process.get_model_weights(out.state).trainable
        assert len(federated) == 1   # W alone is federated; H, b and u stay on the clients
        got_w = federated[0]
        final = process.evaluate_final(out.state, _class_datasets(clients),
                                       _class_datasets(tests), out.personal_states)

    w0, h0, b0 = (np.asarray(v, np.float64) for v in weights.trainable)
    # A client's initial personal state: the model's initial head and a zero class indicator.
    initial = process.initialize_personal("a")
    np.testing.assert_array_equal(initial[0], h0)
    np.testing.assert_array_equal(initial[1], b0)
    np.testing.assert_array_equal(initial[2], np.zeros(M))
    assert len(personalized.personal_state_type(process)) == 3

    def objective(p, x, y, u, features_term):
        logits = x @ p["w"] @ p["h"] + p["b"]
        logits = logits - logits.max(axis=1, keepdims=True)
        ce = np.mean(np.log(np.exp(logits).sum(axis=1)) - logits[np.arange(len(y)), y])
        value = ce + cfg.head_penalty * np.sum(p["h"] ** 2) + cfg.nc_penalty * _numpy_nc(p["h"], u)
        if features_term:  # λ1 times the batch mean (paper) or the batch sum (official code)
            norms = np.sum((x @ p["w"]) ** 2, axis=1)
            value += cfg.feature_penalty * (np.mean(norms) if reduction == "mean" else norms.sum())
        return value

    new_ws, sizes, trained, indicators = [], [], [], []
    for (x, y), personal in zip(clients, out.personal_states):
        x = x.astype(np.float64)
        u = np.zeros(M)
        u[np.unique(y)] = 1.0
        np.testing.assert_array_equal(personal[2], u)   # the class indicator is personal state
        p = {"w": w0.copy(), "h": h0.copy(), "b": b0.copy()}
        if variant == "star":  # FLUTE*: a head epoch first (H and b, no feature term)
            f = lambda q: objective(q, x, y, u, False)  # noqa: E731
            gh, gb = _numeric_grad(f, p, "h"), _numeric_grad(f, p, "b")
            p["h"], p["b"] = p["h"] - LR * gh, p["b"] - LR * gb
        # Joint epoch: W, H, b with the feature term.
        f = lambda q: objective(q, x, y, u, True)  # noqa: E731
        gw, gh, gb = (_numeric_grad(f, p, k) for k in ("w", "h", "b"))
        p = {"w": p["w"] - LR * gw, "h": p["h"] - LR * gh, "b": p["b"] - LR * gb}
        trained.append(p)
        indicators.append(u)
        new_ws.append(p["w"])
        sizes.append(len(x))
    # The server step as the official code takes it: one SGD step of lr η_r on
    # (1/|I|)·Σ_{i∈I} NC_i(H_i), the gradient taken jointly over all the round's heads.
    heads = {f"h{i}": p["h"] for i, p in enumerate(trained)}

    def mean_nc(q):
        return np.mean([_numpy_nc(q[f"h{i}"], u) for i, u in enumerate(indicators)])

    for i, (p, personal) in enumerate(zip(trained, out.personal_states)):
        h = p["h"] - cfg.nc_step * _numeric_grad(mean_nc, heads, f"h{i}")
        np.testing.assert_allclose(personal[0], h, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(personal[1], p["b"], rtol=1e-4, atol=1e-6)
    expected_w = sum(n * w for n, w in zip(sizes, new_ws)) / sum(sizes)
    np.testing.assert_allclose(got_w, expected_w, rtol=1e-4, atol=1e-6)

    # The final round: from its personal H, b, two head-only epochs (one full batch each, no
    # feature term, W = the aggregated W), then cross-entropy and accuracy on its test data.
    losses, correct, accuracies = [], [], []
    for (x, y), (xt, yt), personal in zip(clients, tests, out.personal_states):
        x, xt = x.astype(np.float64), xt.astype(np.float64)
        u = np.asarray(personal[2], np.float64)
        p = {"w": np.asarray(got_w, np.float64), "h": np.asarray(personal[0], np.float64),
             "b": np.asarray(personal[1], np.float64)}
        for _ in range(2):
            f = lambda q: objective(q, x, y, u, False)  # noqa: E731
            gh, gb = _numeric_grad(f, p, "h"), _numeric_grad(f, p, "b")
            p["h"], p["b"] = p["h"] - LR * gh, p["b"] - LR * gb
        logits = xt @ p["w"] @ p["h"] + p["b"]
        logits = logits - logits.max(axis=1, keepdims=True)
        losses.append(np.log(np.exp(logits).sum(axis=1)) - logits[np.arange(len(yt)), yt])
        correct.append(logits.argmax(axis=1) == yt)
        accuracies.append(correct[-1].mean())
    np.testing.assert_allclose(final["loss"], np.concatenate(losses).mean(), rtol=1e-4)
    assert final["accuracy"] == pytest.approx(np.concatenate(correct).mean(), abs=1e-6)
    assert final["mean_client_accuracy"] == pytest.approx(np.mean(accuracies), abs=1e-6)


def test_adaptpfl_with_alpha_zero_reproduces_fedrep_exactly(tff_runtime):
    fedrep = personalized.build_personalized_process(
        "fedrep", _classifier, CLASS_SPEC, LR, head_epochs=2, representation_epochs=2)
    adapt = personalized.build_personalized_process(
        "adaptpfl", lambda: _classifier(shortcut_alpha=0.0), CLASS_SPEC, LR, head_epochs=2,
        shortcut_epochs=3, representation_epochs=2)
    shortcut = adapt.spec.indices([roles.SHORTCUT])
    assert [adapt.spec.trainable[k].name for k in adapt.evaluation.personal_indices] == [
        "head/kernel:0", "head/bias:0", "shortcut/kernel:0"]
    data = _class_datasets(_class_clients(seed=3))
    s_f, s_a = fedrep.initialize(), adapt.initialize()
    p_f = [fedrep.initialize_personal(c) for c in "ab"]
    p_a = [adapt.initialize_personal(c) for c in "ab"]
    for _ in range(3):
        out_f, out_a = fedrep.next(s_f, data, p_f), adapt.next(s_a, data, p_a)
        s_f, p_f, s_a, p_a = out_f.state, out_f.personal_states, out_a.state, out_a.personal_states
        # The whole models (federated W, frozen and initial-personal positions): equal but for
        # AdaptPFL's shortcut.
        w_f = fedrep.model_weights(s_f).trainable
        w_a = [v for k, v in enumerate(adapt.model_weights(s_a).trainable)
               if k not in shortcut]
        assert len(w_a) == len(w_f)
        for a, b in zip(w_a, w_f):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(adapt.get_model_weights(s_a).trainable,
                        fedrep.get_model_weights(s_f).trainable, strict=True):
            np.testing.assert_array_equal(a, b)
        for pa, pf in zip(p_a, p_f):
            np.testing.assert_array_equal(pa[0], pf[0])
            np.testing.assert_array_equal(pa[1], pf[1])
            np.testing.assert_array_equal(pa[2], np.zeros((D, M)))  # α = 0: the shortcut is idle
            # Each client's personalized model, assembled from the state and its personal state.
            full_a = [v for k, v in enumerate(adapt.model_weights(s_a, pa).trainable)
                      if k not in shortcut]
            for a, b in zip(full_a, fedrep.model_weights(s_f, pf).trainable, strict=True):
                np.testing.assert_array_equal(a, b)


def test_adaptpfl_trains_the_shortcut_when_alpha_is_positive(tff_runtime):
    adapt = personalized.build_personalized_process(
        "adaptpfl", lambda: _classifier(shortcut_alpha=0.5), CLASS_SPEC, LR)
    out = adapt.next(adapt.initialize(), _class_datasets(_class_clients(seed=4)),
                     [adapt.initialize_personal(c) for c in "ab"])
    assert np.abs(out.personal_states[0][2]).max() > 0
    # Only the representation goes up: W (D×K) + 3 metric floats + the weight; only W comes down.
    assert adapt.traffic["round"].up == (D * K + 4) * 4
    assert adapt.traffic["round"].down == (D * K) * 4


def test_deep_adaptpfl_round_with_positive_alpha_equals_finite_difference_numpy(tff_runtime):
    """AdaptPFL (variant A) on the deep model, α = 0.5: logits = (1−α)(x·W·H + b) + α·x·S.
    One round of head (H, b), then shortcut S with the new head, then representation W with
    both, each one full-batch step; W averaged by examples. Gradients by central finite
    differences of the numpy cross-entropy."""
    alpha = 0.5
    process = personalized.build_personalized_process(
        "adaptpfl", lambda: _classifier(shortcut_alpha=alpha), CLASS_SPEC, LR)
    clients = _class_clients(seed=8)
    weights = process.model_weights(process.initialize())
    w0, h0, b0, s0 = (np.asarray(v, np.float64) for v in weights.trainable)
    rng = np.random.default_rng(2)
    # Non-zero personal shortcuts, so that the head phase sees the shortcut too.
    starts = [[h0.astype(np.float32), b0.astype(np.float32),
               (0.3 * rng.normal(size=s0.shape)).astype(np.float32)] for _ in clients]
    out = process.next(process.initialize(), _class_datasets(clients), starts)

    def ce(p, x, y):
        logits = (1 - alpha) * (x @ p["w"] @ p["h"] + p["b"]) + alpha * x @ p["s"]
        logits = logits - logits.max(axis=1, keepdims=True)
        return np.mean(np.log(np.exp(logits).sum(axis=1)) - logits[np.arange(len(y)), y])

    new_ws, sizes = [], []
    for (x, y), start, got in zip(clients, starts, out.personal_states):
        x = x.astype(np.float64)
        p = {"w": w0.copy(), "h": h0.copy(), "b": b0.copy(), "s": start[2].astype(np.float64)}
        f = lambda q: ce(q, x, y)  # noqa: E731
        gh, gb = _numeric_grad(f, p, "h"), _numeric_grad(f, p, "b")
        p["h"], p["b"] = p["h"] - LR * gh, p["b"] - LR * gb
        p["s"] = p["s"] - LR * _numeric_grad(f, p, "s")
        p["w"] = p["w"] - LR * _numeric_grad(f, p, "w")
        for k, name in enumerate(("h", "b", "s")):
            np.testing.assert_allclose(got[k], p[name], rtol=1e-4, atol=1e-6, err_msg=name)
        new_ws.append(p["w"])
        sizes.append(len(x))
    expected_w = sum(n * w for n, w in zip(sizes, new_ws)) / sum(sizes)
    np.testing.assert_allclose(process.get_model_weights(out.state).trainable[0], expected_w,
                               rtol=1e-4, atol=1e-6)


def test_flute_and_adaptpfl_bad_input():
    with pytest.raises(ValueError, match="nc_penalty=-1"):
        personalized.FluteConfig(nc_penalty=-1.0)
    with pytest.raises(ValueError, match="feature_penalty=nan"):
        personalized.FluteConfig(feature_penalty=float("nan"))
    with pytest.raises(ValueError, match="apply only to 'flute'"):
        personalized.build_personalized_process("fedrep", _classifier, CLASS_SPEC, LR,
                                                flute=personalized.FluteConfig())
    with pytest.raises(ValueError, match="adaptpfl needs a personal shortcut"):
        personalized.build_personalized_process("adaptpfl", _classifier, CLASS_SPEC, LR)
    with pytest.raises(ValueError, match="shortcut_epochs"):
        personalized.build_personalized_process(
            "adaptpfl", lambda: _classifier(0.5), CLASS_SPEC, LR, shortcut_epochs=0)
    with pytest.raises(ValueError, match=r"alpha=1.5 must be in \[0, 1\]"):
        _classifier(shortcut_alpha=1.5)
    with pytest.raises(ValueError, match="m >= 2 classes"):
        personalized.build_personalized_process("flute", _linear_model, SPEC, LR)
    float_labels = (CLASS_SPEC[0], tf.TensorSpec([None], tf.float32))
    with pytest.raises(ValueError, match="integer class labels"):
        personalized.build_personalized_process("flute", _classifier, float_labels, LR)
    with pytest.raises(ValueError, match="head_epochs=2: plain FLUTE"):
        personalized.build_personalized_process(
            "flute", _classifier, CLASS_SPEC, LR, head_epochs=2,
            flute=personalized.FluteConfig(variant="plain"))
    with pytest.raises(ValueError, match="variant='both' must be one of star, plain"):
        personalized.FluteConfig(variant="both")
    with pytest.raises(ValueError, match="feature_reduction='max'"):
        personalized.FluteConfig(feature_reduction="max")


def test_flute_with_a_lora_representation(tff_runtime):
    """FLUTE over LoRA adapters: A and B are the representation (uploaded and averaged), the
    trainable output layer the personal head."""
    from models import paper_models

    def model_fn():
        return paper_models.build_rolora_mnist_net(input_dim=D, rank=2, num_classes=M, seed=0,
                                                   b_stddev=0.1, trainable_head=True)

    process = personalized.build_personalized_process("flute", model_fn, CLASS_SPEC, LR)
    spec = process.spec
    lora = spec.indices([roles.LORA_A, roles.LORA_B])
    # + 4 bytes each way: the round's client count |I| for the NC step (a 1 up, |I| down).
    assert process.traffic["round"].up == (
        sum(4 * np.prod(spec.trainable[k].shape) for k in lora) + 16 + 4)
    assert process.traffic["round"].down == sum(4 * np.prod(spec.trainable[k].shape)
                                                for k in lora) + 4
    clients = _class_clients(seed=5)
    state = process.initialize()
    out = process.next(state, _class_datasets(clients),
                       [process.initialize_personal(c) for c in "ab"])
    np.testing.assert_array_equal(out.personal_states[1][2], [0.0, 1.0, 1.0])
    # The numbers, against numpy with finite-difference gradients: logits = ReLU(x·A·B)·H + b,
    # features ψ = ReLU(x·A·B); a head epoch, a joint epoch (A, B, H, b; + λ1·mean‖ψ‖²), the
    # server's NC step (η_r on the mean NC of the two heads), A and B averaged by examples.
    cfg = personalized.FluteConfig()
    a0, b0, h0, c0 = (np.asarray(v, np.float64) for v in process.model_weights(state).trainable)

    def objective(p, x, y, u, features_term):
        feats = np.maximum(x @ p["a"] @ p["b"], 0.0)
        logits = feats @ p["h"] + p["c"]
        logits = logits - logits.max(axis=1, keepdims=True)
        value = np.mean(np.log(np.exp(logits).sum(axis=1)) - logits[np.arange(len(y)), y])
        value += cfg.head_penalty * np.sum(p["h"] ** 2) + cfg.nc_penalty * _numpy_nc(p["h"], u)
        if features_term:
            value += cfg.feature_penalty * np.mean(np.sum(feats**2, axis=1))
        return value

    trained, indicators, sizes = [], [], []
    for x, y in clients:
        x = x.astype(np.float64)
        u = np.zeros(M)
        u[np.unique(y)] = 1.0
        p = {"a": a0.copy(), "b": b0.copy(), "h": h0.copy(), "c": c0.copy()}
        f = lambda q: objective(q, x, y, u, False)  # noqa: E731
        gh, gc = _numeric_grad(f, p, "h"), _numeric_grad(f, p, "c")
        p["h"], p["c"] = p["h"] - LR * gh, p["c"] - LR * gc
        f = lambda q: objective(q, x, y, u, True)  # noqa: E731
        grads = {k: _numeric_grad(f, p, k) for k in p}
        p = {k: p[k] - LR * grads[k] for k in p}
        trained.append(p)
        indicators.append(u)
        sizes.append(len(x))
    heads = {f"h{i}": p["h"] for i, p in enumerate(trained)}

    def mean_nc(q):
        return np.mean([_numpy_nc(q[f"h{i}"], u) for i, u in enumerate(indicators)])

    for i, (p, got) in enumerate(zip(trained, out.personal_states)):
        np.testing.assert_allclose(got[0], p["h"] - cfg.nc_step * _numeric_grad(
            mean_nc, heads, f"h{i}"), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(got[1], p["c"], rtol=1e-4, atol=1e-6)
    federated = process.get_model_weights(out.state).trainable
    for k, name in enumerate(("a", "b")):
        expected = sum(n * p[name] for n, p in zip(sizes, trained)) / sum(sizes)
        np.testing.assert_allclose(federated[k], expected, rtol=1e-4, atol=1e-6, err_msg=name)
