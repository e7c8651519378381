"""tffl.simulation.driver: a diverging training loss stops the run, naming the learning rate and
keeping the last good checkpoint; a slow or noisy run is never stopped."""

import numpy as np
import pytest
import tensorflow as tf

from tffl.simulation import checkpoint
from tffl.simulation import driver
from tffl.simulation import metrics_log
from tffl.simulation import participation

_CLIENTS = ["a", "b"]


class _LossProcess:
    """A process whose round t reports the training loss `losses[t - 1]` (state: the round)."""

    def __init__(self, losses):
        self.losses = list(losses)

    def initialize(self):
        return {"t": np.int64(0)}

    def next(self, state, datasets):
        del datasets
        t = int(state["t"]) + 1
        return {"t": np.int64(t)}, {"client_work": {"train": {"loss": self.losses[t - 1]}}}


def _data(cid, round_num):
    del cid
    return tf.data.Dataset.from_tensor_slices(np.array([[round_num]], np.float32))


def _run(tmp_path, losses, rounds=None, **kw):
    return driver.run_rounds(
        _LossProcess(losses), participation.FullParticipation(_CLIENTS), _data,
        rounds or len(losses), tmp_path,
        driver.RunOptions(
            config={"learning_rate": 1000000.0, "server_learning_rate": 1.0, "seed": 0}, log=None,
            tensorboard=False, **kw))


def test_a_blown_up_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    # train.py --algorithm=rolora --learning_rate=1e6 --rounds=3 reported these losses.
    with pytest.raises(metrics_log.LossDivergedError) as raised:
        _run(tmp_path, [1.0e3, 1.6e14, 2.0e26])
    message = str(raised.value)
    assert message.startswith("round 2: training loss 1.6e+14 is over 100 times round 1's 1e+03")
    assert "learning_rate=1000000.0" in message
    assert "(round 1) is kept in" in message
    assert isinstance(raised.value, FloatingPointError)  # train.py: one line, exit status 1
    assert checkpoint.latest(tmp_path / driver.CHECKPOINT_DIR)[0] == 1
    rows = metrics_log.read_metrics(tmp_path / driver.METRICS_FILE)
    assert [r["round"] for r in rows] == [1]


def test_a_loss_stuck_at_chance_or_noisy_never_stops():
    rng = np.random.default_rng(0)
    chance = [0.69 + 0.05 * rng.standard_normal() for _ in range(50)]
    noisy = [2.3 * float(np.exp(rng.standard_normal())) for _ in range(50)]
    for losses in (chance, noisy):
        assert not any(metrics_log.diverged(loss, losses[0]) for loss in losses)


def test_the_run_of_a_slow_loss_completes(tmp_path):
    losses = [0.6931, 0.7012, 0.6950, 0.7300, 0.6890, 0.6931]
    result = _run(tmp_path, losses)
    assert [r["train_loss"] for r in result.history] == losses


def test_a_resumed_run_compares_with_its_first_round_and_none_disables(tmp_path):
    _run(tmp_path / "cut", [0.5, 0.6, 150.0], rounds=2)
    with pytest.raises(metrics_log.LossDivergedError, match="round 3: .* round 1's 0.5"):
        _run(tmp_path / "cut", [0.5, 0.6, 150.0], rounds=3, resume=True)
    assert checkpoint.latest(tmp_path / "cut" / driver.CHECKPOINT_DIR)[0] == 2
    result = _run(tmp_path / "free", [0.5, 0.6, 150.0], divergence_factor=None)
    assert result.history[-1]["train_loss"] == 150.0


def test_a_nan_loss_names_the_learning_rate_too(tmp_path):
    with pytest.raises(metrics_log.NonFiniteLossError,
                       match=r"round 2: training loss is nan with learning_rate=1000000.0"):
        _run(tmp_path, [1.0, float("nan")])
