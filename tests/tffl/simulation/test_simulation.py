"""tffl.simulation.driver: the round loop's metrics, checkpoints and resume, on a process with known math.

The toy process keeps a running vector state s; a round adds the mean over the sampled clients of
(their data sum) — so every round's state is an exact closed form the test computes independently.
"""

import math
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from tffl.simulation import checkpoint
from tffl.simulation import participation
from tffl.runtime import worker_connection
from tffl.simulation import driver
from tffl.simulation import metrics_log


class _SumProcess:
    def __init__(self, nan_at=None):
        self.nan_at = nan_at
        self.calls = 0

    def initialize(self):
        return {"s": np.zeros(2, np.float64), "t": np.int64(0)}

    def next(self, state, datasets):
        self.calls += 1
        sums = [sum(x.numpy() for x in ds) for ds in datasets]
        new = {"s": state["s"] + np.mean(sums, axis=0), "t": state["t"] + 1}
        loss = float("nan") if self.nan_at == int(new["t"]) else float(np.sum(new["s"]))
        return new, {"client_work": {"train": {"loss": loss, "accuracy": 0.5}}}


_CLIENTS = [f"c{i}" for i in range(6)]


def _data(cid, round_num):
    i = _CLIENTS.index(cid)
    return tf.data.Dataset.from_tensor_slices(np.array([[i, round_num]], np.float64))


def _run(tmp_path, rounds, resume=False, process=None, config=None, **kw):
    return driver.run_rounds(
        process or _SumProcess(), participation.UniformSampler(_CLIENTS, 3, seed=1), _data, rounds,
        tmp_path,
        driver.RunOptions(config=config or {"seed": 1}, resume=resume, log=None, **kw))


def _expected_state(rounds):
    sampler = participation.UniformSampler(_CLIENTS, 3, seed=1)
    s = np.zeros(2)
    for t in range(1, rounds + 1):
        ids = sampler.sample(t).client_ids
        s = s + np.mean([[_CLIENTS.index(c), t] for c in ids], axis=0)
    return s


def test_state_metrics_and_files(tmp_path):
    result = _run(tmp_path, rounds=4, evaluate_fn=lambda st: {"norm": np.linalg.norm(st["s"])},
                  eval_every=2)
    np.testing.assert_allclose(result.state["s"], _expected_state(4))
    rows = metrics_log.read_metrics(tmp_path / "metrics.csv")
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["train_loss"] == pytest.approx(np.sum(_expected_state(4)))
    assert rows[-1]["train_accuracy"] == 0.5 and rows[0]["clients"] == 3
    assert "eval_norm" in rows[1] and "eval_norm" in rows[3] and "eval_norm" not in rows[0]
    assert (tmp_path / "checkpoints" / "round_000004").is_dir()


def test_interrupted_then_resumed_equals_uninterrupted(tmp_path):
    full = _run(tmp_path / "full", rounds=6)
    _run(tmp_path / "cut", rounds=3)
    resumed_process = _SumProcess()
    resumed = _run(tmp_path / "cut", rounds=6, resume=True, process=resumed_process)
    assert resumed.first_round == 4 and resumed_process.calls == 3
    np.testing.assert_array_equal(resumed.state["s"], full.state["s"])
    drop = set(metrics_log.MACHINE_COLUMNS)
    a = [{k: v for k, v in r.items() if k not in drop}
         for r in metrics_log.read_metrics(tmp_path / "full" / "metrics.csv")]
    b = [{k: v for k, v in r.items() if k not in drop}
         for r in metrics_log.read_metrics(tmp_path / "cut" / "metrics.csv")]
    assert a == b


def test_rows_after_the_last_checkpoint_are_dropped_on_resume(tmp_path):
    _run(tmp_path, rounds=5, checkpoint_every=2)  # checkpoints at 2, 4 and 5
    (tmp_path / "checkpoints" / "round_000005").rename(tmp_path / "gone")
    import shutil
    shutil.rmtree(tmp_path / "gone")
    result = _run(tmp_path, rounds=5, resume=True, checkpoint_every=2)
    assert result.first_round == 5
    rows = metrics_log.read_metrics(tmp_path / "metrics.csv")
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5]


def test_existing_run_without_resume_is_refused(tmp_path):
    _run(tmp_path, rounds=2)
    with pytest.raises(driver.ResumeError, match="pass --resume"):
        _run(tmp_path, rounds=4)


def test_resume_with_other_config_is_refused(tmp_path):
    _run(tmp_path, rounds=2, config={"seed": 1, "learning_rate": 0.1})
    with pytest.raises(driver.ResumeError, match="differs in: learning_rate"):
        _run(tmp_path, rounds=4, resume=True, config={"seed": 1, "learning_rate": 0.2})


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    with pytest.raises(metrics_log.NonFiniteLossError, match="round 3: training loss is nan"):
        _run(tmp_path, rounds=5, process=_SumProcess(nan_at=3))
    assert (tmp_path / "checkpoints" / "round_000002").is_dir()
    assert not (tmp_path / "checkpoints" / "round_000003").exists()


def test_flatten_metrics():
    flat = metrics_log.flatten_metrics({"a": {"b": np.float32(1.5), "c": ()}, "d": [1, 2]})
    assert flat == {"a/b": 1.5, "d/0": 1.0, "d/1": 2.0}
    assert math.isnan(metrics_log.flatten_metrics({"x": float("nan")})["x"])


def test_rounds_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="rounds=0"):
        _run(tmp_path, rounds=0)


def _tensorboard_scalars(summary_dir):
    """{tag: {step: value}} read back from the event files (scalars are written as tensors)."""
    out = {}
    for path in sorted(summary_dir.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                number = float(tf.make_ndarray(value.tensor))
                out.setdefault(value.tag, {})[event.step] = number
    return out


def test_rows_are_released_to_tensorboard(tmp_path):
    _run(tmp_path, rounds=3, evaluate_fn=lambda st: {"norm": np.linalg.norm(st["s"])},
         eval_every=1)
    rows = metrics_log.read_metrics(tmp_path / "metrics.csv")
    scalars = _tensorboard_scalars(tmp_path / "tensorboard")
    for tag in ("train_loss", "eval_norm", "clients"):
        assert scalars[tag] == pytest.approx({r["round"]: r[tag] for r in rows}), tag
    np.testing.assert_allclose(scalars["train_loss"][3], np.sum(_expected_state(3)), rtol=1e-6)


def test_tensorboard_can_be_turned_off(tmp_path):
    _run(tmp_path, rounds=1, tensorboard=False)
    assert not (tmp_path / "tensorboard").exists()


class _DiesAt(_SumProcess):
    """`next` raises what a dead TFF worker raises, in round `at`."""

    def __init__(self, at):
        super().__init__()
        self.at = at

    def next(self, state, datasets):
        if int(state["t"]) + 1 == self.at:
            raise worker_connection.WorkerError(
                "TFF worker #1 (pid 1, localhost:1) killed by SIGKILL")
        return super().next(state, datasets)


def test_worker_death_keeps_completed_rounds_and_resume_matches(tmp_path):
    """A `WorkerError` in round 4 stops the run: rounds 1-3 stay checkpointed and in metrics.csv,
    and resuming completes the run as if it had never stopped."""
    full = _run(tmp_path / "full", rounds=6)
    with pytest.raises(worker_connection.WorkerError, match="killed by SIGKILL"):
        _run(tmp_path / "cut", rounds=6, process=_DiesAt(4))
    assert checkpoint.latest(tmp_path / "cut" / "checkpoints")[0] == 3
    assert [r["round"] for r in metrics_log.read_metrics(tmp_path / "cut" / "metrics.csv")] == [
        1, 2, 3]
    resumed = _run(tmp_path / "cut", rounds=6, resume=True)
    assert resumed.first_round == 4
    np.testing.assert_array_equal(resumed.state["s"], full.state["s"])
    drop = set(metrics_log.MACHINE_COLUMNS)
    full_rows, resumed_rows = (
        [{k: v for k, v in r.items() if k not in drop}
         for r in metrics_log.read_metrics(tmp_path / d / "metrics.csv")]
        for d in ("full", "cut"))
    assert full_rows == resumed_rows


def test_until_stops_the_run_after_the_first_row_that_satisfies_it(tmp_path):
    """`until` ends the run after round 3; its state is the 3-round state, the stop round is
    checkpointed, and resuming the finished run returns it unchanged."""
    def until(row):
        return row["round"] >= 3

    result = _run(tmp_path, rounds=10, until=until)
    assert [r["round"] for r in result.history] == [1, 2, 3]
    np.testing.assert_allclose(result.state["s"], _expected_state(3))
    assert checkpoint.latest(tmp_path / driver.CHECKPOINT_DIR)[0] == 3
    again = _run(tmp_path, rounds=10, resume=True, until=until)
    assert [r["round"] for r in again.history] == [1, 2, 3]


def test_after_round_sees_every_row_and_state(tmp_path):
    seen = []
    result = _run(tmp_path, rounds=3,
                  after_round=lambda row, state: seen.append((row["round"], state["s"].copy())))
    assert [r for r, _ in seen] == [1, 2, 3]
    for r, state in seen:
        np.testing.assert_allclose(state, _expected_state(r))
    np.testing.assert_allclose(result.state["s"], seen[-1][1])


class _WaitsForTheNextRound(_SumProcess):
    """`next` of round t < `rounds` waits (at most 30 s) until round t + 1's first dataset was
    asked for and records whether it was: the loop builds the next round during this one."""

    def __init__(self, rounds):
        super().__init__()
        self.rounds = rounds
        self.asked = {}  # round -> threading.Event
        self.overlapped = []

    def data(self, cid, round_num):
        self.asked.setdefault(round_num, threading.Event()).set()
        return _data(cid, round_num)

    def next(self, state, datasets):
        t = self.calls + 1
        if t < self.rounds:  # the last round has no next to wait for
            self.overlapped.append(self.asked.setdefault(t + 1, threading.Event()).wait(30))
        return super().next(state, datasets)


def test_the_next_rounds_datasets_are_built_while_a_round_runs(tmp_path):
    process = _WaitsForTheNextRound(rounds=4)
    result = driver.run_rounds(
        process, participation.UniformSampler(_CLIENTS, 3, seed=1), process.data, 4, tmp_path,
        driver.RunOptions(log=None, tensorboard=False))
    assert process.overlapped == [True, True, True]
    assert 5 not in process.asked  # nothing is built beyond the last round
    np.testing.assert_allclose(result.state["s"], _expected_state(4))
    rows = metrics_log.read_metrics(tmp_path / "metrics.csv")
    assert all(r["data_seconds"] >= 0.0 for r in rows)


def test_prefetch_gives_the_same_run_as_building_each_round_in_turn(tmp_path):
    calls = {True: [], False: []}
    results = {}
    for prefetch in (True, False):
        def data(cid, round_num, log=calls[prefetch]):
            log.append((round_num, cid))
            return _data(cid, round_num)

        results[prefetch] = driver.run_rounds(
            _SumProcess(), participation.UniformSampler(_CLIENTS, 3, seed=1), data, 5,
            tmp_path / str(prefetch),
            driver.RunOptions(
                log=None, tensorboard=False,
                evaluate_fn=lambda st: {"norm": np.linalg.norm(st["s"])}, eval_every=2,
                prefetch=prefetch))
    assert calls[True] == calls[False]  # the same clients' datasets, in the same order
    drop = set(metrics_log.MACHINE_COLUMNS)
    assert ([{k: v for k, v in r.items() if k not in drop} for r in results[True].history]
            == [{k: v for k, v in r.items() if k not in drop} for r in results[False].history])
    np.testing.assert_array_equal(results[True].state["s"], _expected_state(5))


class _CountingSampler(participation.UniformSampler):
    def __init__(self):
        super().__init__(_CLIENTS, 3, seed=1)
        self.asked = []

    def sample(self, round_num):
        self.asked.append(round_num)
        return super().sample(round_num)


def test_each_round_is_sampled_once_in_order_and_a_stopped_run_leaves_no_build_behind(tmp_path):
    sampler, built = _CountingSampler(), []

    def slow_data(cid, round_num):
        time.sleep(0.05)  # still building round 3 when round 2 stops the run
        built.append(round_num)
        return _data(cid, round_num)

    driver.run_rounds(
        _SumProcess(), sampler, slow_data, 6, tmp_path,
        driver.RunOptions(log=None, tensorboard=False, until=lambda row: row["round"] == 2))
    assert sampler.asked == [1, 2, 3]
    assert built == [1, 1, 1, 2, 2, 2, 3, 3, 3]  # round 3's build finished before the return


def test_a_failed_build_of_the_next_round_surfaces_when_that_round_starts(tmp_path):
    def data(cid, round_num):
        if round_num == 3:
            raise FileNotFoundError(f"client {cid}: its round-3 file is missing")
        return _data(cid, round_num)

    with pytest.raises(FileNotFoundError, match="round-3 file is missing"):
        driver.run_rounds(
            _SumProcess(), participation.UniformSampler(_CLIENTS, 3, seed=1), data, 5, tmp_path,
            driver.RunOptions(log=None, tensorboard=False))
    rows = metrics_log.read_metrics(tmp_path / "metrics.csv")
    assert [r["round"] for r in rows] == [1, 2]  # rounds 1 and 2 are kept, and checkpointed
    assert checkpoint.latest(tmp_path / "checkpoints")[0] == 2


def test_metrics_rows_read_back_as_written(tmp_path):
    # A resumed run rewrites its earlier rows from read_metrics: the bytes columns (ints) used to
    # come back as floats ("39960.0").
    path = tmp_path / "metrics.csv"
    rows = [{"round": 1, "clients": 3, "bytes_up_per_client": 39960, "train_loss": 0.25,
             "client_work/train/num_examples": 480.0, "eval_accuracy": float("nan")}]
    metrics_log.write_metrics(path, rows)
    text = path.read_text()
    back = metrics_log.read_metrics(path)
    assert back[0]["bytes_up_per_client"] == 39960
    assert isinstance(back[0]["bytes_up_per_client"], int)
    assert isinstance(back[0]["client_work/train/num_examples"], float)
    metrics_log.write_metrics(path, back)
    assert path.read_text() == text
