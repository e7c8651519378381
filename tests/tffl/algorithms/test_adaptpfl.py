"""tffl.algorithms.adaptpfl: AdaptPFL's variants on the deep (Keras) model, against numpy written from
adaptpfl.md §1.5: logits = (1−α)(x·W·H + b) + α·x·S, every client dataset one full batch (one
epoch = one gradient step), gradients by central finite differences of the numpy
cross-entropy."""

import numpy as np
import pytest

from tests.tffl.algorithms.personalized_models import (CLASS_SPEC, LR, D, K, M, class_clients,
                                                       classifier, full_batch_datasets,
                                                       numeric_grad)
from tffl.algorithms import adaptpfl
from tffl.engine import model_spec
from tffl.algorithms import personalized
from tffl.engine import roles

ALPHA = 0.5


def _ce(p, x, y):
    logits = (1 - ALPHA) * (x @ p["w"] @ p["h"] + p["b"]) + ALPHA * x @ p["s"]
    logits = logits - logits.max(axis=1, keepdims=True)
    return np.mean(np.log(np.exp(logits).sum(axis=1)) - logits[np.arange(len(y)), y])


def _round(config):
    """One round of `config` on two clients with non-zero starting shortcuts: (process, the
    clients, the starting personal states, the round's output)."""
    process = personalized.build_personalized_process(
        "adaptpfl", lambda: classifier(shortcut_alpha=ALPHA), CLASS_SPEC, LR, adaptpfl=config)
    clients = class_clients(seed=8)
    weights = process.model_weights(process.initialize())
    h0, b0, s0 = (np.asarray(v, np.float32) for v in weights.trainable[1:])
    rng = np.random.default_rng(2)
    starts = [[h0, b0, (0.3 * rng.normal(size=s0.shape)).astype(np.float32)] for _ in clients]
    out = process.next(process.initialize(), full_batch_datasets(clients), starts)
    return process, clients, starts, weights, out


def _check(process, clients, out, expected):
    new_ws = []
    for got, p in zip(out.personal_states, expected):
        for k, name in enumerate(("h", "b", "s")):
            np.testing.assert_allclose(got[k], p[name], rtol=1e-4, atol=1e-6, err_msg=name)
        new_ws.append(p["w"])
    sizes = [len(x) for x, _ in clients]
    expected_w = sum(n * w for n, w in zip(sizes, new_ws)) / sum(sizes)
    np.testing.assert_allclose(process.get_model_weights(out.state).trainable[0], expected_w,
                               rtol=1e-4, atol=1e-6)


def _numpy_round(clients, starts, w0, order, beta, q=None, lam_s=1.0, lam_w=1.0):
    """Each client's (w, h, b, s) after one round written from adaptpfl.md §1.5: the shortcut's
    step with ridge β, projected by (I − QQᵀ) when Q is given, and the head's step, in `order`;
    both damped toward their stored values (λ = 1: not); then W's step with the damped pair."""
    expected = []
    for (x, y), start in zip(clients, starts):
        x = x.astype(np.float64)
        f = lambda q_: _ce(q_, x, y)  # noqa: E731
        old = {"w": w0, "h": start[0].astype(np.float64), "b": start[1].astype(np.float64),
               "s": start[2].astype(np.float64)}
        p = dict(old)

        def shortcut_step():
            s = p["s"] - LR * (numeric_grad(f, p, "s") + beta * p["s"])
            p["s"] = s if q is None else s - q @ (q.T @ s)

        def head_step():
            gh, gb = numeric_grad(f, p, "h"), numeric_grad(f, p, "b")
            p["h"], p["b"] = p["h"] - LR * gh, p["b"] - LR * gb

        for step in ((shortcut_step, head_step) if order == "sw" else (head_step, shortcut_step)):
            step()
        p["s"] = (1 - lam_s) * old["s"] + lam_s * p["s"]
        p["h"] = (1 - lam_w) * old["h"] + lam_w * p["h"]
        p["b"] = (1 - lam_w) * old["b"] + lam_w * p["b"]
        p["w"] = p["w"] - LR * numeric_grad(f, p, "w")
        expected.append(p)
    return expected


@pytest.mark.parametrize("order", ["sw", "ws"])
def test_variant_b_round_equals_numpy_of_eqs_2_to_7(tff_runtime, order):
    """Variant B with ridge β, projection (3), damping λ_S (4) and λ_W (6): S̃ by a ridge step,
    S̄ = (I − QQᵀ)S̃ with Q = orth(W), the head step from the stored head with S̄ (order sw) or
    before the shortcut (ws), both damped toward their stored values, then W's step with the
    damped pair; W averaged by examples."""
    beta, lam_s, lam_w = 0.3, 0.5, 0.7
    config = adaptpfl.AdaptPFLConfig(variant="b", order=order, shortcut_ridge=beta,
                                     shortcut_damping=lam_s, head_damping=lam_w)
    process, clients, starts, weights, out = _round(config)
    w0 = np.asarray(weights.trainable[0], np.float64)
    q, _ = np.linalg.qr(w0)
    _check(process, clients, out, _numpy_round(clients, starts, w0, order, beta, q, lam_s, lam_w))
    # Projected: every client's stored shortcut is orthogonal to span(W⁰) up to float32 (the
    # damping mixes in the unprojected stored S, so only with λ_S = 1 would it be exactly).
    assert np.abs(q.T @ (out.personal_states[0][2] - (1 - lam_s) * starts[0][2])).max() < 1e-5


def test_variant_a_with_a_shortcut_ridge_equals_numpy(tff_runtime):
    """Variant A (head, shortcut, representation) with β: only the shortcut's step gets + β·S;
    no projection and no damping."""
    beta = 0.4
    process, clients, starts, weights, out = _round(adaptpfl.AdaptPFLConfig(shortcut_ridge=beta))
    w0 = np.asarray(weights.trainable[0], np.float64)
    _check(process, clients, out, _numpy_round(clients, starts, w0, "ws", beta))


def test_phases_and_bad_input():
    spec = model_spec.inspect_model(lambda: classifier(shortcut_alpha=ALPHA), CLASS_SPEC)
    head, shortcut, rep = (1, 2), (3,), (0,)
    a = adaptpfl.phases(adaptpfl.AdaptPFLConfig(), spec, head, shortcut, rep, 2, 3, 4)
    assert [(p.train_indices, p.epochs, p.after) for p in a] == [
        (head, 2, None), (shortcut, 3, None), (rep, 4, None)]
    b = adaptpfl.phases(adaptpfl.AdaptPFLConfig("b", project_shortcut=False), spec, head,
                        shortcut, rep, 2, 3, 4)
    assert [p.train_indices for p in b] == [shortcut, head, rep]
    assert all(p.after is None for p in b)  # no projection, λ = 1: nothing after
    assert adaptpfl.projection_kernels(spec, shortcut, rep) == (3, 0)
    with pytest.raises(ValueError, match="variant='c' must be one of a, b"):
        adaptpfl.AdaptPFLConfig("c")
    with pytest.raises(ValueError, match="order='x'"):
        adaptpfl.AdaptPFLConfig("b", order="x")
    with pytest.raises(ValueError, match="shortcut_ridge=-1"):
        adaptpfl.AdaptPFLConfig(shortcut_ridge=-1.0)
    with pytest.raises(ValueError, match="head_damping=1.5 must be in"):
        adaptpfl.AdaptPFLConfig("b", head_damping=1.5)
    with pytest.raises(ValueError, match="damping is variant B's step"):
        adaptpfl.AdaptPFLConfig("a", shortcut_damping=0.5)
    def kernels(*shapes):
        return model_spec.ModelSpec(tuple(
            model_spec.VariableInfo(f"v{i}", shape, np.float32, "shared")
            for i, shape in enumerate(shapes)), ())

    with pytest.raises(ValueError, match="kernel is 4×5: its span is all of R\\^4"):
        adaptpfl.projection_kernels(kernels((4, 5), (4, 3)), (1,), (0,))
    with pytest.raises(ValueError, match="reads its 4-dimensional input, and the model has none"):
        adaptpfl.projection_kernels(kernels((2, 3), (4, 3)), (1,), (0,))
    with pytest.raises(ValueError, match="applies only to 'adaptpfl'"):
        personalized.build_personalized_process("fedrep", classifier, CLASS_SPEC, LR,
                                                adaptpfl=adaptpfl.AdaptPFLConfig())


# ---- AdaptPFL's variant A (the default) -------------------------------------------------------

def test_adaptpfl_with_alpha_zero_reproduces_fedrep_exactly(tff_runtime):
    fedrep = personalized.build_personalized_process(
        "fedrep", classifier, CLASS_SPEC, LR, head_epochs=2, representation_epochs=2)
    adapt = personalized.build_personalized_process(
        "adaptpfl", lambda: classifier(shortcut_alpha=0.0), CLASS_SPEC, LR, head_epochs=2,
        shortcut_epochs=3, representation_epochs=2)
    shortcut = adapt.spec.indices([roles.SHORTCUT])
    assert [adapt.spec.trainable[k].name for k in adapt.evaluation.personal_indices] == [
        "head/kernel:0", "head/bias:0", "shortcut/kernel:0"]
    data = full_batch_datasets(class_clients(seed=3))
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
        "adaptpfl", lambda: classifier(shortcut_alpha=0.5), CLASS_SPEC, LR)
    out = adapt.next(adapt.initialize(), full_batch_datasets(class_clients(seed=4)),
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
        "adaptpfl", lambda: classifier(shortcut_alpha=alpha), CLASS_SPEC, LR)
    clients = class_clients(seed=8)
    weights = process.model_weights(process.initialize())
    w0, h0, b0, s0 = (np.asarray(v, np.float64) for v in weights.trainable)
    rng = np.random.default_rng(2)
    # Non-zero personal shortcuts, so that the head phase sees the shortcut too.
    starts = [[h0.astype(np.float32), b0.astype(np.float32),
               (0.3 * rng.normal(size=s0.shape)).astype(np.float32)] for _ in clients]
    out = process.next(process.initialize(), full_batch_datasets(clients), starts)

    def ce(p, x, y):
        logits = (1 - alpha) * (x @ p["w"] @ p["h"] + p["b"]) + alpha * x @ p["s"]
        logits = logits - logits.max(axis=1, keepdims=True)
        return np.mean(np.log(np.exp(logits).sum(axis=1)) - logits[np.arange(len(y)), y])

    new_ws, sizes = [], []
    for (x, y), start, got in zip(clients, starts, out.personal_states):
        x = x.astype(np.float64)
        p = {"w": w0.copy(), "h": h0.copy(), "b": b0.copy(), "s": start[2].astype(np.float64)}
        f = lambda q: ce(q, x, y)  # noqa: E731
        gh, gb = numeric_grad(f, p, "h"), numeric_grad(f, p, "b")
        p["h"], p["b"] = p["h"] - LR * gh, p["b"] - LR * gb
        p["s"] = p["s"] - LR * numeric_grad(f, p, "s")
        p["w"] = p["w"] - LR * numeric_grad(f, p, "w")
        for k, name in enumerate(("h", "b", "s")):
            np.testing.assert_allclose(got[k], p[name], rtol=1e-4, atol=1e-6, err_msg=name)
        new_ws.append(p["w"])
        sizes.append(len(x))
    expected_w = sum(n * w for n, w in zip(sizes, new_ws)) / sum(sizes)
    np.testing.assert_allclose(process.get_model_weights(out.state).trainable[0], expected_w,
                               rtol=1e-4, atol=1e-6)


def test_adaptpfl_bad_input():
    with pytest.raises(ValueError, match="adaptpfl needs a personal shortcut"):
        personalized.build_personalized_process("adaptpfl", classifier, CLASS_SPEC, LR)
    with pytest.raises(ValueError, match="shortcut_epochs"):
        personalized.build_personalized_process(
            "adaptpfl", lambda: classifier(0.5), CLASS_SPEC, LR, shortcut_epochs=0)
    with pytest.raises(ValueError, match=r"alpha=1.5 must be in \[0, 1\]"):
        classifier(shortcut_alpha=1.5)
