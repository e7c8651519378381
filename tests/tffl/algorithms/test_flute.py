"""tffl.algorithms.personalized's FLUTE (Algorithm 2 of flute.md) on the deep (Keras) classifier
of personalized_models.py: the neural-collapse term, one FLUTE round and the final round against
numpy with finite-difference gradients, FLUTE over LoRA adapters, and its bad input."""

import numpy as np
import pytest
import tensorflow as tf

from tests.tffl.algorithms.personalized_models import (CLASS_SPEC, LR, D, M, SPEC, class_clients,
                                                       classifier, full_batch_datasets,
                                                       linear_model, numeric_grad, numpy_nc)
from tffl.algorithms import personalized
from tffl.algorithms import flute
from tffl.engine import roles


def test_neural_collapse_matches_numpy_vanishes_at_the_etf_and_has_the_right_gradient():
    rng = np.random.default_rng(0)
    h = rng.normal(size=(4, M))
    u = np.array([1.0, 0.0, 1.0])
    assert float(flute.neural_collapse(h, u)) == pytest.approx(numpy_nc(h, u), rel=1e-10)
    # A 3-class simplex ETF (120° apart) with every class present is a zero of NC.
    angles = 2 * np.pi * np.arange(M) / M
    etf = np.stack([np.cos(angles), np.sin(angles)])
    assert float(flute.neural_collapse(etf, np.ones(M))) < 1e-5
    # Gradient against central finite differences of the numpy formula.
    var = tf.Variable(h)
    with tf.GradientTape() as tape:
        value = flute.neural_collapse(var, u)
    grad = tape.gradient(value, var).numpy()
    eps, numeric = 1e-6, np.zeros_like(h)
    for idx in np.ndindex(*h.shape):
        step = np.zeros_like(h)
        step[idx] = eps
        numeric[idx] = (numpy_nc(h + step, u) - numpy_nc(h - step, u)) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("variant, reduction", [("star", "mean"), ("plain", "sum")])
def test_flute_round_equals_finite_difference_numpy(variant, reduction, tff_runtime):
    """One FLUTE* round (head epoch, joint epoch, the server's step of η_r on the mean NC of the
    round's heads, mean of W) against numpy, with every gradient taken by central finite
    differences of the numpy objectives; then the code's final round: every client fine-tunes
    its head for 2 epochs on the FLUTE objective (W fixed) and is tested."""
    cfg = flute.FluteConfig(feature_penalty=0.05, head_penalty=0.02, nc_penalty=0.3,
                                   nc_step=0.4, variant=variant, feature_reduction=reduction,
                                   final_head_epochs=2)
    tests = class_clients(seed=12, sizes=(4, 7))
    process = personalized.build_personalized_process("flute", classifier, CLASS_SPEC, LR,
                                                      flute=cfg)
    clients = class_clients(seed=11)
    state = process.initialize()
    weights = process.model_weights(state)
    out = process.next(state, full_batch_datasets(clients),
                       [process.initialize_personal(c) for c in "ab"])
    federated = process.get_model_weights(out.state).trainable
    assert len(federated) == 1   # W alone is federated; H, b and u stay on the clients
    got_w = federated[0]
    final = process.evaluate_final(out.state, full_batch_datasets(clients),
                                   full_batch_datasets(tests), out.personal_states)

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
        value = ce + cfg.head_penalty * np.sum(p["h"] ** 2) + cfg.nc_penalty * numpy_nc(p["h"], u)
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
            gh, gb = numeric_grad(f, p, "h"), numeric_grad(f, p, "b")
            p["h"], p["b"] = p["h"] - LR * gh, p["b"] - LR * gb
        # Joint epoch: W, H, b with the feature term.
        f = lambda q: objective(q, x, y, u, True)  # noqa: E731
        gw, gh, gb = (numeric_grad(f, p, k) for k in ("w", "h", "b"))
        p = {"w": p["w"] - LR * gw, "h": p["h"] - LR * gh, "b": p["b"] - LR * gb}
        trained.append(p)
        indicators.append(u)
        new_ws.append(p["w"])
        sizes.append(len(x))
    # The server step as the official code takes it: one SGD step of lr η_r on
    # (1/|I|)·Σ_{i∈I} NC_i(H_i), the gradient taken jointly over all the round's heads.
    heads = {f"h{i}": p["h"] for i, p in enumerate(trained)}

    def mean_nc(q):
        return np.mean([numpy_nc(q[f"h{i}"], u) for i, u in enumerate(indicators)])

    for i, (p, personal) in enumerate(zip(trained, out.personal_states)):
        h = p["h"] - cfg.nc_step * numeric_grad(mean_nc, heads, f"h{i}")
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
            gh, gb = numeric_grad(f, p, "h"), numeric_grad(f, p, "b")
            p["h"], p["b"] = p["h"] - LR * gh, p["b"] - LR * gb
        logits = xt @ p["w"] @ p["h"] + p["b"]
        logits = logits - logits.max(axis=1, keepdims=True)
        losses.append(np.log(np.exp(logits).sum(axis=1)) - logits[np.arange(len(yt)), yt])
        correct.append(logits.argmax(axis=1) == yt)
        accuracies.append(correct[-1].mean())
    np.testing.assert_allclose(final["loss"], np.concatenate(losses).mean(), rtol=1e-4)
    assert final["accuracy"] == pytest.approx(np.concatenate(correct).mean(), abs=1e-6)
    assert final["mean_client_accuracy"] == pytest.approx(np.mean(accuracies), abs=1e-6)


def test_flute_bad_input():
    with pytest.raises(ValueError, match="nc_penalty=-1"):
        flute.FluteConfig(nc_penalty=-1.0)
    with pytest.raises(ValueError, match="feature_penalty=nan"):
        flute.FluteConfig(feature_penalty=float("nan"))
    with pytest.raises(ValueError, match="apply only to 'flute'"):
        personalized.build_personalized_process("fedrep", classifier, CLASS_SPEC, LR,
                                                flute=flute.FluteConfig())
    with pytest.raises(ValueError, match="m >= 2 classes"):
        personalized.build_personalized_process("flute", linear_model, SPEC, LR)
    float_labels = (CLASS_SPEC[0], tf.TensorSpec([None], tf.float32))
    with pytest.raises(ValueError, match="integer class labels"):
        personalized.build_personalized_process("flute", classifier, float_labels, LR)
    with pytest.raises(ValueError, match="head_epochs=2: plain FLUTE"):
        personalized.build_personalized_process(
            "flute", classifier, CLASS_SPEC, LR, head_epochs=2,
            flute=flute.FluteConfig(variant="plain"))
    with pytest.raises(ValueError, match="variant='both' must be one of star, plain"):
        flute.FluteConfig(variant="both")
    with pytest.raises(ValueError, match="feature_reduction='max'"):
        flute.FluteConfig(feature_reduction="max")


def test_flute_with_a_lora_representation(tff_runtime):
    """FLUTE over LoRA adapters: A and B are the representation (uploaded and averaged), the
    trainable output layer the personal head."""
    from models import paper_models

    def model_fn():
        return paper_models.build_rolora_mnist_net(paper_models.RoloraMnistNetConfig(
            input_dim=D, rank=2, num_classes=M, seed=0, b_stddev=0.1, trainable_head=True))

    process = personalized.build_personalized_process("flute", model_fn, CLASS_SPEC, LR)
    spec = process.spec
    lora = spec.indices([roles.LORA_A, roles.LORA_B])
    # + 4 bytes each way: the round's client count |I| for the NC step (a 1 up, |I| down).
    assert process.traffic["round"].up == (
        sum(4 * np.prod(spec.trainable[k].shape) for k in lora) + 16 + 4)
    assert process.traffic["round"].down == sum(4 * np.prod(spec.trainable[k].shape)
                                                for k in lora) + 4
    clients = class_clients(seed=5)
    state = process.initialize()
    out = process.next(state, full_batch_datasets(clients),
                       [process.initialize_personal(c) for c in "ab"])
    np.testing.assert_array_equal(out.personal_states[1][2], [0.0, 1.0, 1.0])
    # The numbers, against numpy with finite-difference gradients: logits = ReLU(x·A·B)·H + b,
    # features ψ = ReLU(x·A·B); a head epoch, a joint epoch (A, B, H, b; + λ1·mean‖ψ‖²), the
    # server's NC step (η_r on the mean NC of the two heads), A and B averaged by examples.
    cfg = flute.FluteConfig()
    a0, b0, h0, c0 = (np.asarray(v, np.float64) for v in process.model_weights(state).trainable)

    def objective(p, x, y, u, features_term):
        feats = np.maximum(x @ p["a"] @ p["b"], 0.0)
        logits = feats @ p["h"] + p["c"]
        logits = logits - logits.max(axis=1, keepdims=True)
        value = np.mean(np.log(np.exp(logits).sum(axis=1)) - logits[np.arange(len(y)), y])
        value += cfg.head_penalty * np.sum(p["h"] ** 2) + cfg.nc_penalty * numpy_nc(p["h"], u)
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
        gh, gc = numeric_grad(f, p, "h"), numeric_grad(f, p, "c")
        p["h"], p["c"] = p["h"] - LR * gh, p["c"] - LR * gc
        f = lambda q: objective(q, x, y, u, True)  # noqa: E731
        grads = {k: numeric_grad(f, p, k) for k in p}
        p = {k: p[k] - LR * grads[k] for k in p}
        trained.append(p)
        indicators.append(u)
        sizes.append(len(x))
    heads = {f"h{i}": p["h"] for i, p in enumerate(trained)}

    def mean_nc(q):
        return np.mean([numpy_nc(q[f"h{i}"], u) for i, u in enumerate(indicators)])

    for i, (p, got) in enumerate(zip(trained, out.personal_states)):
        np.testing.assert_allclose(got[0], p["h"] - cfg.nc_step * numeric_grad(
            mean_nc, heads, f"h{i}"), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(got[1], p["c"], rtol=1e-4, atol=1e-6)
    federated = process.get_model_weights(out.state).trainable
    for k, name in enumerate(("a", "b")):
        expected = sum(n * p[name] for n, p in zip(sizes, trained)) / sum(sizes)
        np.testing.assert_allclose(federated[k], expected, rtol=1e-4, atol=1e-6, err_msg=name)
