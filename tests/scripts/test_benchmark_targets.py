"""benchmarks/targets.py: its plain baseline (benchmarks/plain.py, the benchmark's one plain
loop) is the federated round it claims to be, and a missing data folder is one line. (The suite
itself is a 40-minute measurement, not a test.)"""

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import targets
from benchmarks.config import TARGETS, TargetsConfig
from benchmarks.plain import PlainLoop, SubRound
from scripts import benchmark


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_plain_loop_is_sgd_per_client_then_the_weighted_mean():
    """logits = x·W + b, cross-entropy: ∇W = xᵀ(softmax − onehot)/B, ∇b = Σ(softmax − onehot)/B.
    Client i runs SGD over its batches from the broadcast (W, b); the server adds
    Σ n_i (w_i − w) / Σ n_i. Only the round's trained variables move."""
    rng = np.random.default_rng(0)
    d, c, lr = 3, 2, 0.3
    inputs = tf.keras.Input((d,))
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(c)(inputs))
    w0 = [rng.normal(size=(d, c)).astype(np.float32), rng.normal(size=c).astype(np.float32)]
    loop = PlainLoop(model, lr, [SubRound("both", (((0, 1), 1),), (0, 1)),
                                 SubRound("bias", (((1,), 1),), (1,))])
    loop.reset(w0, [])
    clients = []
    for n in (4, 6):
        x = rng.normal(size=(n, d)).astype(np.float32)
        y = rng.integers(0, c, n).astype(np.int32)
        clients.append((x, y))
    datasets = [tf.data.Dataset.from_tensor_slices(xy).batch(2) for xy in clients]

    def numpy_round(weights, trained):
        sums = [np.zeros_like(w) for w in weights]
        total = 0
        for x, y in clients:
            w, b = [v.copy() for v in weights]
            for k in range(0, len(x), 2):
                xb, yb = x[k:k + 2], y[k:k + 2]
                g = (_softmax(xb @ w + b) - np.eye(c)[yb]) / len(xb)
                if 0 in trained:
                    w = w - lr * xb.T @ g
                b = b - lr * g.sum(axis=0)
            for s, new, old in zip(sums, (w, b), weights):
                s += len(x) * (new - old)
            total += len(x)
        return [old + s / total for old, s in zip(weights, sums)]

    want = numpy_round(w0, (0, 1))
    loss = loop.round(datasets, "both")
    assert np.isfinite(loss)
    for got, expected in zip(loop.trainable, want):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    want = numpy_round(want, (1,))
    loop.round(datasets, "bias")
    for got, expected in zip(loop.trainable, want):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_targets_without_sst2_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        benchmark.check(["benchmark.py", "--suite=targets", f"--data_dir={tmp_path}",
                         f"--output_dir={tmp_path / 'out'}"])
    stderr = capsys.readouterr().err
    assert exited.value.code == 2
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"--data_dir={tmp_path}: no sst2/ folder" in lines[0], stderr


def test_targets_parts_are_checked_and_a_subset_formats(tmp_path):
    with pytest.raises(ValueError, match="choose from scaling, main, large"):
        targets.run_targets(TargetsConfig(parts=("nope",)), tmp_path)
    # The table of a main-only run: its keys, the in-process ratio among them, no other part's.
    main_only = {"round_time_vs_previous_path": 0.3, "round_time_vs_plain_uncached": 0.4,
                 "cpu_vs_plain_cached": 1.0, "state_io_seconds": 0.01,
                 "distribute_vs_tff_round_time": 0.9, "main": None}
    main_only["met"] = {k: main_only[k] <= v for k, v in TARGETS.items()
                        if k in main_only}
    table = targets.format_targets(main_only)
    assert "| distribute_vs_tff_round_time | 0.900 | reported | |" in table
    assert "memory_200_vs_10" not in table and "large_peak_mb" not in table
