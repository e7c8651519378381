"""tffl.algorithms.adaptpfl_linear: linear AdaptPFL (Algorithm 1, variant A) against independent numpy.

Two independent references, written from the specs rather than from the module:

* `_numpy_fedrep_round`: FedRep with gradient heads and no shortcut at all (FedRep Algorithm 1
  with GRD = one full-batch gradient step on f_i(w, B) = (1/(2m))‖X B w − y‖²): τ_w head steps
  with B fixed, τ_b local steps on B with the new head, plain mean of the B_i, no QR.
* `_numpy_adaptpfl_round`: adaptpfl.md §1.4 with θ = (1 − α)Bw + αs, the true gradients of §1.2,
  head → shortcut (new head, ridge β) → representation (new head and shortcut), mean of the B_i.
"""

import collections

import numpy as np
import pytest

from tasks.synthetic import ShortcutTruth
from tasks.synthetic import adaptpfl_linear as synthetic_adaptpfl_linear
from tffl.algorithms import adaptpfl_linear
from tffl.engine import linear_engine
from tffl.algorithms.adaptpfl_linear import AdaptPFLLinearConfig
from tffl.engine import personal_state
from tests.tffl.algorithms.linear_data import clients as _data


def _personal(heads, shortcuts):
    return [collections.OrderedDict(head=np.asarray(w, np.float32),
                                    shortcut=np.asarray(s, np.float32))
            for w, s in zip(heads, shortcuts)]


def _f32(a):
    return np.asarray(a, np.float32).astype(np.float64)


def _numpy_fedrep_round(b, heads, clients, eta, tau_w, tau_b):
    """FedRep, gradient heads: returns (B', heads', mean loss at the start)."""
    new_b, new_heads, losses = [], [], []
    for w, item in zip(heads, clients):
        x, y = item["x"].astype(np.float64), item["y"].astype(np.float64)
        m = len(y)
        r = x @ b @ w - y
        losses.append(r @ r / (2 * m))
        for _ in range(tau_w):
            w = w - eta * b.T @ x.T @ (x @ b @ w - y) / m
        bi = b
        for _ in range(tau_b):
            bi = bi - eta * np.outer(x.T @ (x @ bi @ w - y), w) / m
        new_heads.append(_f32(w))
        new_b.append(_f32(bi))
    return _f32(np.mean(new_b, axis=0)), new_heads, float(np.mean(losses))


def _numpy_adaptpfl_round(b, heads, shortcuts, clients, alpha, etas, taus, beta):
    eta_b, eta_w, eta_s = etas
    tau_w, tau_s, tau_b = taus
    new_b, new_heads, new_shortcuts, losses = [], [], [], []
    for w, s, item in zip(heads, shortcuts, clients):
        x, y = item["x"].astype(np.float64), item["y"].astype(np.float64)
        m = len(y)

        def res(bb, w, s):
            return x @ ((1 - alpha) * bb @ w + alpha * s) - y

        r = res(b, w, s)
        losses.append(r @ r / (2 * m))
        for _ in range(tau_w):
            w = w - eta_w * (1 - alpha) * b.T @ x.T @ res(b, w, s) / m
        for _ in range(tau_s):
            s = s - eta_s * (alpha * x.T @ res(b, w, s) / m + beta * s)
        bi = b
        for _ in range(tau_b):
            bi = bi - eta_b * (1 - alpha) * np.outer(x.T @ res(bi, w, s), w) / m
        new_heads.append(_f32(w))
        new_shortcuts.append(_f32(s))
        new_b.append(_f32(bi))
    return _f32(np.mean(new_b, axis=0)), new_heads, new_shortcuts, float(np.mean(losses))


_RNG = np.random.default_rng(0)
_D, _K = 6, 2
# Three clients with different m (5, 8, 3) and arbitrary targets (not from the model); a
# non-orthonormal B and non-zero personal states, so that every term of the round matters.
_CLIENTS = _data([_RNG.normal(size=(m, _D)) for m in (5, 8, 3)],
                 [_RNG.normal(size=m) for m in (5, 8, 3)])
_B0 = _f32(0.7 * _RNG.normal(size=(_D, _K)))
_HEADS = [_f32(_RNG.normal(size=_K)) for _ in range(3)]
_SHORTCUTS = [_f32(_RNG.normal(size=_D)) for _ in range(3)]


def _start(process):
    return linear_engine.set_representation(process, process.initialize(), _B0)


def _train(metrics):
    """The round's training metrics (TFF's structure: client_work/train)."""
    return metrics["client_work"]["train"]


def test_alpha_zero_reproduces_fedrep_iterates(tff_runtime):
    """α = 0: B and the heads are FedRep's (gradient heads) round after round; the shortcut is
    never read and never moves."""
    eta, tau_w, tau_b = 0.07, 3, 2
    process = adaptpfl_linear.build_adaptpfl_linear(AdaptPFLLinearConfig(
        _D, _K, alpha=0.0, learning_rate=eta, head_steps=tau_w, shortcut_steps=4,
        representation_steps=tau_b))
    state, personal = _start(process), _personal(_HEADS, _SHORTCUTS)
    b, heads = _B0, _HEADS
    for t in range(4):
        output = process.next_round(state, _CLIENTS, personal)
        assert isinstance(output, personal_state.PersonalizedOutput)
        b, heads, loss = _numpy_fedrep_round(b, heads, _CLIENTS, eta, tau_w, tau_b)
        state, personal = output.state, output.personal_states
        assert process.round_num(state) == t + 1
        np.testing.assert_allclose(linear_engine.get_representation(state), b,
                                   rtol=1e-6, atol=1e-7)
        for p, w, s in zip(personal, heads, _SHORTCUTS):
            np.testing.assert_allclose(p["head"], w, rtol=1e-6, atol=1e-7)
            np.testing.assert_array_equal(p["shortcut"], np.float32(s))
        np.testing.assert_allclose(_train(output.metrics)["loss"], loss, rtol=1e-6)
    np.testing.assert_allclose(adaptpfl_linear.predictors(process, state, personal),
                               np.stack(heads) @ b.T, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("alpha, taus, etas, beta", [
    (0.3, (2, 3, 1), (0.05, 0.05, 0.05), 0.0),
    (0.6, (1, 2, 3), (0.04, 0.1, 0.2), 0.5),
    (0.5, (0, 4, 0), (0.05, 0.05, 0.3), 0.1),
])
def test_rounds_equal_numpy(tff_runtime, alpha, taus, etas, beta):
    process = adaptpfl_linear.build_adaptpfl_linear(AdaptPFLLinearConfig(
        _D, _K, alpha=alpha, learning_rate=etas[0], head_learning_rate=etas[1],
        shortcut_learning_rate=etas[2], head_steps=taus[0], shortcut_steps=taus[1],
        representation_steps=taus[2], shortcut_ridge=beta))
    state, personal = _start(process), _personal(_HEADS, _SHORTCUTS)
    b, heads, shortcuts = _B0, _HEADS, _SHORTCUTS
    for _ in range(2):
        output = process.next_round(state, _CLIENTS, personal)
        b, heads, shortcuts, loss = _numpy_adaptpfl_round(b, heads, shortcuts, _CLIENTS, alpha,
                                                          etas, taus, beta)
        state, personal = output.state, output.personal_states
        np.testing.assert_allclose(linear_engine.get_representation(state), b,
                                   rtol=1e-5, atol=1e-6)
        for p, w, s in zip(personal, heads, shortcuts):
            np.testing.assert_allclose(p["head"], w, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(p["shortcut"], s, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(_train(output.metrics)["loss"], loss, rtol=1e-5)
        assert _train(output.metrics)["num_clients"] == 3
    np.testing.assert_allclose(
        adaptpfl_linear.predictors(process, state, personal),
        (1 - alpha) * np.stack(heads) @ b.T + alpha * np.stack(shortcuts), rtol=1e-5, atol=1e-6)


def test_alpha_one_is_local_regression_on_the_shortcut(tff_runtime):
    process = adaptpfl_linear.build_adaptpfl_linear(AdaptPFLLinearConfig(
        _D, _K, alpha=1.0, learning_rate=0.1, head_steps=3, shortcut_steps=2,
        representation_steps=2))
    output = process.next_round(_start(process), _CLIENTS, _personal(_HEADS, _SHORTCUTS))
    # B_i = B for every client; the server's float32 mean of equal values is B up to an ulp.
    np.testing.assert_allclose(linear_engine.get_representation(output.state), _B0, rtol=3e-7)
    for p, w, s, item in zip(output.personal_states, _HEADS, _SHORTCUTS, _CLIENTS):
        np.testing.assert_array_equal(p["head"], np.float32(w))
        x, y = item["x"].astype(np.float64), item["y"].astype(np.float64)
        for _ in range(2):
            s = s - 0.1 * x.T @ (x @ s - y) / len(y)
        np.testing.assert_allclose(p["shortcut"], s, rtol=1e-5, atol=1e-6)


def test_initial_states_and_store(tff_runtime):
    process = adaptpfl_linear.build_adaptpfl_linear(
        AdaptPFLLinearConfig(_D, _K, alpha=0.3, learning_rate=0.1, seed=2))
    b = linear_engine.get_representation(process.initialize())
    np.testing.assert_allclose(b.T @ b, np.eye(_K), atol=1e-6)
    first = process.initialize_personal("x")
    np.testing.assert_array_equal(first["head"], np.zeros(_K, np.float32))
    np.testing.assert_array_equal(first["shortcut"], np.zeros(_D, np.float32))
    assert process.personal is not None
    assert process.personal.names == ("head", "shortcut") and process.config.alpha == 0.3
    store = personal_state.PersonalStore(process.initialize_personal)
    ids = ["a", "b", "c"]
    output = process.next_round(_start(process), _CLIENTS, store.lookup(ids))
    store.update(ids, output.personal_states)
    kept = store.get("c")
    output = process.next_round(output.state, _CLIENTS[:2], store.lookup(ids[:2]))
    store.update(ids[:2], output.personal_states)
    np.testing.assert_array_equal(store.get("c")["shortcut"], kept["shortcut"])
    assert _train(output.metrics)["num_clients"] == 2


@pytest.mark.large
def test_shortcut_lowers_personalized_error_on_shortcut_data(tff_runtime):
    """Clients θ_i* = 0.7 B*w_i* + 0.3 s_i* (s_i* ⊥ B*, ‖s_i*‖ = 1), d=10, k=2, 20 clients with
    m=20 samples, the same B⁰ and schedule (τ_w=10, τ_s=10, τ_b=1, η=0.1, 40 rounds): AdaptPFL
    (α=0.3) ends with a lower mean ‖θ_i − θ_i*‖ than FedRep (its α=0). FedRep cannot express the
    shortcut: its error stays near the shortcut's size 0.3. Observed: 0.15 against 0.36."""
    problem = synthetic_adaptpfl_linear(num_clients=20, num_samples=20, dim=10, rank=2,
                                        shortcuts=ShortcutTruth(alpha=0.3), noise_std=0.05,
                                        seed=1)
    data = _data(problem.features, problem.targets)
    b0 = np.linalg.qr(problem.b_star + 0.3 * np.random.default_rng(5).normal(size=(10, 2)))[0]
    errors = {}
    for alpha in (0.0, 0.3):
        process = adaptpfl_linear.build_adaptpfl_linear(
            AdaptPFLLinearConfig(10, 2, alpha=alpha, learning_rate=0.1))
        state = linear_engine.set_representation(process, process.initialize(), b0)
        personal = [process.initialize_personal(i) for i in range(20)]
        for _ in range(40):
            output = process.next_round(state, data, personal)
            state, personal = output.state, output.personal_states
        thetas = adaptpfl_linear.predictors(process, state, personal)
        errors[alpha] = np.mean(np.linalg.norm(thetas - problem.thetas, axis=1))
    assert errors[0.3] < 0.6 * errors[0.0], errors
    assert errors[0.0] > 0.2, errors


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(alpha=-0.1), "alpha=-0.1"),
        (dict(alpha=1.5), "alpha=1.5"),
        (dict(alpha=float("nan")), "alpha=nan"),
        (dict(dim=0, rank=1), "dim=0"),
        (dict(rank=0), "rank=0"),
        (dict(rank=7), "rank=7"),
        (dict(learning_rate=0.0), "learning_rate=0.0"),
        (dict(learning_rate=-0.5), "learning_rate=-0.5"),
        (dict(head_learning_rate=-1.0), "head_learning_rate=-1.0"),
        (dict(shortcut_learning_rate=0.0), "shortcut_learning_rate=0.0"),
        (dict(head_steps=-1), "head_steps=-1"),
        (dict(shortcut_steps=2.5), "shortcut_steps=2.5"),
        (dict(representation_steps=-3), "representation_steps=-3"),
        (dict(shortcut_ridge=-0.01), "shortcut_ridge=-0.01"),
    ],
)
def test_bad_arguments_raise_naming_the_value(kwargs, message):
    args = dict(dim=6, rank=2, alpha=0.3, learning_rate=0.1) | kwargs
    with pytest.raises(ValueError, match=message):
        adaptpfl_linear.build_adaptpfl_linear(AdaptPFLLinearConfig(**args))


def test_bad_shapes_raise(tff_runtime):
    process = adaptpfl_linear.build_adaptpfl_linear(
        AdaptPFLLinearConfig(_D, _K, alpha=0.3, learning_rate=0.1))
    state = process.initialize()
    personal = _personal(_HEADS, _SHORTCUTS)
    with pytest.raises(ValueError, match="shape"):
        process.next_round(state, _data([np.zeros((4, _D + 1))] * 3, [np.zeros(4)] * 3),
                           personal)
    with pytest.raises(ValueError, match="personal states"):
        process.next_round(state, _CLIENTS, personal[:1])
    with pytest.raises(ValueError, match="shortcut"):
        process.next_round(state, _CLIENTS, _personal(_HEADS, [np.zeros(_D - 1)] * 3))
    with pytest.raises(ValueError, match="shape"):
        linear_engine.set_representation(process, state, np.zeros((_D + 1, _K)))


# --- Variant B: the draft's analysed iteration (2)–(8), adaptpfl.md §1.5 -----------------------


def _qr_q(b):
    q, r = np.linalg.qr(b)
    return q * np.where(np.diag(r) < 0, -1.0, 1.0)[None, :]


def _numpy_variant_b_round(b, clients, heads, shortcuts, alpha, beta, eta, project, lam_s, lam_w,
                           order):
    """adaptpfl.md §1.5, the per-client form, written out in numpy (float64)."""
    new_heads, new_shortcuts, grads = [], [], []
    for item, w, s in zip(clients, heads, shortcuts):
        x, y = item["x"].astype(np.float64), item["y"].astype(np.float64)
        m, d = x.shape
        pi = x.T @ x / m

        def ridge_shortcut(w_cur):   # (2) and (3)
            target = y - (1 - alpha) * x @ b @ w_cur
            s_tilde = alpha * np.linalg.pinv(alpha**2 * pi + beta * np.eye(d)) @ (x.T @ target / m)
            return s_tilde - b @ (b.T @ s_tilde) if project else s_tilde

        def ls_head(s_cur):          # (5): argmin_w (1/2m)‖y − αXs − (1−α)XBw‖²
            design = (1 - alpha) * x @ b
            return np.linalg.lstsq(design, y - alpha * x @ s_cur, rcond=None)[0]

        if order == "sw":
            s_bar = ridge_shortcut(w)
            s_new = (1 - lam_s) * s + lam_s * s_bar                        # (4)
            w_new = (1 - lam_w) * w + lam_w * ls_head(s_bar)               # (6)
        else:
            w_new = (1 - lam_w) * w + lam_w * ls_head(s)
            s_new = (1 - lam_s) * s + lam_s * ridge_shortcut(w_new)
        r = y - x @ ((1 - alpha) * b @ w_new + alpha * s_new)
        grads.append(-((1 - alpha) / m) * np.outer(x.T @ r, w_new))        # (7)
        new_heads.append(w_new)
        new_shortcuts.append(s_new)
    return _qr_q(b - eta * np.mean(grads, axis=0)), new_heads, new_shortcuts   # (7)–(8)


@pytest.mark.parametrize("project, lam_s, lam_w, order", [
    (True, 1.0, 1.0, "sw"),     # the analysed iteration, undamped
    (True, 0.5, 0.8, "sw"),     # with damping
    (False, 1.0, 1.0, "ws"),    # ablations: no projection, Algorithm 1's order
])
def test_variant_b_rounds_equal_numpy(tff_runtime, project, lam_s, lam_w, order):
    d, k, alpha, beta, eta = 6, 2, 0.3, 0.05, 0.2
    rng = np.random.default_rng(9)
    clients = _data([rng.normal(size=(m, d)) for m in (12, 9, 15)],
                    [rng.normal(size=m) for m in (12, 9, 15)])
    process = adaptpfl_linear.build_adaptpfl_linear(AdaptPFLLinearConfig(
        d, k, alpha, eta, shortcut_ridge=beta, variant="b", project_shortcut=project,
        shortcut_damping=lam_s, head_damping=lam_w, order=order, seed=1))
    heads = [rng.normal(size=k) for _ in clients]
    shortcuts = [rng.normal(size=d) for _ in clients]
    state = process.initialize()
    b = linear_engine.get_representation(state).astype(np.float64)
    np.testing.assert_allclose(b.T @ b, np.eye(k), atol=1e-6)   # B̂⁰ orthonormal
    personal = _personal(heads, shortcuts)
    for _ in range(2):
        broadcast = b
        out = process.next_round(state, clients, personal)
        state, personal = out.state, out.personal_states
        b, heads, shortcuts = _numpy_variant_b_round(b, clients, heads, shortcuts, alpha, beta,
                                                     eta, project, lam_s, lam_w, order)
        np.testing.assert_allclose(linear_engine.get_representation(state), b,
                                   rtol=1e-4, atol=1e-5)
        for got, w, s in zip(personal, heads, shortcuts):
            np.testing.assert_allclose(got["head"], w, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(got["shortcut"], s, rtol=1e-4, atol=1e-5)
            if project and lam_s == 1.0:   # (3) undamped: s_i ⟂ span(B̂) of its round
                np.testing.assert_allclose(broadcast.T @ got["shortcut"], 0.0, atol=1e-5)


def test_variant_b_bad_arguments():
    with pytest.raises(ValueError, match="alpha=1.0: variant B"):
        adaptpfl_linear.build_adaptpfl_linear(AdaptPFLLinearConfig(6, 2, 1.0, 0.1, variant="b"))
    with pytest.raises(ValueError, match=r"shortcut_damping=0.0 must be in \(0, 1\]"):
        adaptpfl_linear.build_adaptpfl_linear(
            AdaptPFLLinearConfig(6, 2, 0.3, 0.1, variant="b", shortcut_damping=0.0))
    with pytest.raises(ValueError, match="order='bw' must be one of sw, ws"):
        adaptpfl_linear.build_adaptpfl_linear(
            AdaptPFLLinearConfig(6, 2, 0.3, 0.1, variant="b", order="bw"))
    with pytest.raises(ValueError, match="variant='c' must be one of a, b"):
        adaptpfl_linear.build_adaptpfl_linear(AdaptPFLLinearConfig(6, 2, 0.3, 0.1, variant="c"))
