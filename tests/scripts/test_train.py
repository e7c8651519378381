"""scripts/train.py end to end, in subprocesses: outputs, interrupt and resume, no orphans; its flag
errors in this process (`experiments.train_flags`, which train.py parses and checks with)."""

import contextlib
import json
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import time

import psutil
import pytest
from absl import flags

from experiments import machine
from experiments import train_flags
from experiments import train_options
from experiments.cli import UsageError
from tffl.simulation import driver as simulation

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "train.py"
_FAST = ["--algorithm=fedavg", "--partition=iid", "--num_clients=6", "--clients_per_round=3",
         "--local_steps=3", "--eval_every=2", "--learning_rate=0.1"]


def _run(*args, timeout=300):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )


def _rows(path):
    drop = set(simulation.TIMING_COLUMNS)
    return [{k: v for k, v in r.items() if k not in drop}
            for r in simulation.read_metrics(path / "metrics.csv")]


def _flag_values() -> flags.FlagValues:
    """train.py's flags, in a FlagValues of their own (absl's global ones stay untouched)."""
    flag_values = flags.FlagValues()
    train_flags.define(flag_values)
    return flag_values


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--algorithm=nope"], "--algorithm"),
        (["--output_dir=/proc/tffl_not_writable"], "--output_dir"),
        (["--resume"], "--resume"),
        (["--rank=65"], "--rank"),
    ],
)
def test_bad_flags_are_one_clear_line(args, flag, tmp_path, capsys):
    """train.py's parsing and checks (`train_flags.parse`, run before TensorFlow is imported), in
    this process: exit status, exactly one stderr line, no traceback."""
    if not any(a.startswith(("--output_dir", "--resume")) for a in args):
        args = [*args, f"--output_dir={tmp_path}"]  # never write runs/ into the checkout
    with pytest.raises(SystemExit) as exited:
        train_flags.parse(["train.py", *args], _flag_values())
    assert exited.value.code != 0
    stderr = capsys.readouterr().err
    err = stderr.strip().splitlines()
    assert len(err) == 1, stderr
    assert flag in err[0] and "Traceback" not in stderr
    if args[0] == "--algorithm=nope":
        assert "fedavg" in err[0] and "rolora" in err[0]  # the allowed values are named


# Checked by `train_options.check` (the code path above), each must fail with one line naming
# the flag.
_VALIDATED = [
    (["--num_clients=0"], "--num_clients"),
    (["--num_clients=4", "--clients_per_round=5"], "--clients_per_round"),
    (["--learning_rate=-1"], "--learning_rate"),
    (["--algorithm=rolora,rolora"], "--algorithm"),
    (["--rank=0"], "--rank"),
    (["--algorithm=fedrep", "--head_epochs=0"], "--head_epochs"),
    (["--algorithm=fedrep", "--representation_epochs=-2"], "--representation_epochs"),
    (["--participation=srpfl", "--stage_rounds=0"], "--stage_rounds"),
    (["--participation=srpfl", "--stage_rounds=ten"], "--stage_rounds"),
    (["--communication_cost=-1"], "--communication_cost"),
    (["--algorithm=fedavg", "--finetune_epochs=3"], "--finetune_epochs"),
    (["--algorithm=adaptpfl", "--shortcut_alpha=1.5"], "--shortcut_alpha"),
    (["--algorithm=adaptpfl", "--shortcut_alpha=-0.1"], "--shortcut_alpha"),
    (["--algorithm=adaptpfl", "--shortcut_damping=0.5"], "--shortcut_damping"),
    (["--algorithm=adaptpfl", "--adaptpfl_variant=b", "--head_damping=0"], "--head_damping"),
    (["--algorithm=adaptpfl", "--shortcut_ridge=-1"], "--shortcut_ridge"),
    (["--algorithm=fedrep", "--adaptpfl_variant=b"], "--adaptpfl_variant"),
    (["--algorithm=flute", "--flute_nc_penalty=-1"], "--flute_nc_penalty"),
    (["--algorithm=flute", "--flute_feature_penalty=-0.5"], "--flute_feature_penalty"),
    (["--algorithm=adaptpfl", "--representation=lora"], "--representation"),
    (["--lora_layers=a,b"], "--lora_layers"),
    (["--lora_alpha=0"], "--lora_alpha"),
    (["--task=sst2", "--algorithm=adaptpfl"], "--task"),
    (["--workers=0"], "--workers"),
    (["--worker_timeout=0"], "--worker_timeout"),
    (["--workers=2", "--worker_addresses=h:1"], "--workers"),
    (["--client_momentum=1.5"], "--client_momentum"),
    (["--client_optimizer=adam", "--client_momentum=0.5"], "--client_momentum"),
    (["--server_optimizer=adam", "--server_momentum=0.9"], "--server_momentum"),
    (["--weight_decay=-0.1"], "--weight_decay"),
    (["--server_learning_rate=0"], "--server_learning_rate"),
    (["--algorithm=fedsa_lora", "--representation=lora_alternating"], "--representation"),
    (["--participation=srpfl", "--num_clients=6", "--clients_per_round=6",
      "--initial_participants=7"], "--initial_participants"),
    (["--participation=srpfl", "--num_clients=10", "--srpfl_pool=11"], "--srpfl_pool"),
    (["--participation=uniform", "--srpfl_pool=2"], "--srpfl_pool"),
    (["--participation=srpfl", "--num_clients=10", "--srpfl_pool=4",
      "--initial_participants=5"], "--initial_participants"),
    (["--algorithm=flute", "--flute_variant=plain", "--head_epochs=3"], "--head_epochs"),
    (["--algorithm=fedper", "--representation_blocks=2"], "--representation_blocks"),
    (["--algorithm=fedrep", "--representation_blocks=0"], "--representation_blocks"),
    (["--client_optimizer=sgdm"], "--client_momentum"),
    (["--runtime=distribute", "--workers=2"], "--workers"),
    (["--devices=CPU:0"], "--devices"),
    (["--runtime=distribute", "--logical_cpus=-1"], "--logical_cpus"),
    (["--algorithm=rolora", "--client_ranks=2,4"], "--client_ranks"),
    (["--task=mnist", "--eval_test"], "--eval_test"),
    (["--algorithm=fedrep", "--flute_final_head_epochs=3"], "--flute_final_head_epochs"),
    (["--algorithm=flute", "--flute_final_head_epochs=-1"], "--flute_final_head_epochs"),
    (["--algorithm=flora", "--rank=4", "--client_ranks=2,8"], "--client_ranks"),
    (["--algorithm=flexlora", "--client_ranks=0,2"], "--client_ranks"),
    (["--algorithm=flexlora", "--client_ranks=a"], "--client_ranks"),
]
# Found while building the task (after the flags passed the checks), by
# `experiments.training.run_algorithm`, unless the checks already refuse them (the first two:
# `train_options` makes the library's checks of --rank and --data_dir before TensorFlow).
_BUILD_ERRORS = [
    (["--algorithm=flora", "--client_ranks=2,65"], "--client_ranks"),
    (["--task=reviews", "--algorithm=fedrep"], "--data_dir"),
    (["--algorithm=fedrep", "--evaluate_only"], "--evaluate_only"),   # no checkpoint to evaluate
]


def test_flag_checks_name_the_flag(tmp_path):
    """Both lists, in this process."""
    from experiments import training

    for i, (args, flag) in enumerate(_VALIDATED + _BUILD_ERRORS):
        flag_values = _flag_values()
        try:
            flag_values(["train.py", *args, f"--output_dir={tmp_path / str(i)}"])
            options = train_flags.options(flag_values)
            train_options.check(options, train_flags.present(flag_values))
            output_dir = train_options.output_dir(options)
            if i >= len(_VALIDATED):
                training.run_algorithm(options["algorithm"][0], output_dir, options)
            message = ""
        except (UsageError, flags.Error, ValueError) as e:
            message = str(e)
        assert flag in message and "\n" not in message, (args, message)


def test_job_writes_results_and_refuses_to_overwrite(tmp_path):
    proc = _run(*_FAST, "--rounds=3", f"--output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert "done: fedavg 3 communication rounds" in proc.stdout and "round 3/3" in proc.stdout
    rows = _rows(tmp_path)
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert rows[-1]["bytes_up_per_client"] > 0 and "eval_accuracy" in rows[-1]
    summary = json.loads((tmp_path / "summary.json").read_text())
    # The machine the run ran on (experiments.machine), for tracing a rerun's float differences.
    assert summary["machine"]["cpus"] == os.cpu_count() and summary["machine"]["cpu"]
    again = _run(*_FAST, "--rounds=3", f"--output_dir={tmp_path}", timeout=120)
    assert again.returncode == 2 and "--resume" in again.stderr
    assert _rows(tmp_path) == rows  # nothing overwritten
    # --evaluate_only with other flags than the run's names itself, not --resume.
    other = _run(*_FAST, "--rounds=3", "--learning_rate=0.2", f"--output_dir={tmp_path}",
                 "--evaluate_only", timeout=120)
    message = other.stderr.strip().splitlines()
    assert other.returncode == 2 and len(message) == 1, other.stderr
    assert "--evaluate_only" in message[0] and "learning_rate" in message[0], message
    assert _rows(tmp_path) == rows and not (tmp_path / "evaluation.json").exists()
    # A damaged sittings record stops a resumed run in one line before it trains a round.
    with open(tmp_path / machine.SITTINGS_FILE, "a") as f:
        f.write("not json\n")
    damaged = _run(*_FAST, "--rounds=4", f"--output_dir={tmp_path}", "--resume", timeout=120)
    message = damaged.stderr.strip().splitlines()
    assert damaged.returncode == 1 and len(message) == 1, damaged.stderr
    assert "sittings.jsonl, line 2: not a recorded sitting" in message[0], message
    assert _rows(tmp_path) == rows


def test_interrupt_then_resume_matches_an_uninterrupted_run(tmp_path):
    # SIGINT after round 2 must land mid-run however far this reader lags behind the run: the
    # run's stdout is a one-page pipe, so it blocks on its progress lines a few dozen rounds
    # later until this test reads on, and this test reads on only after sending the signal.
    rounds = "--rounds=60"
    full = tmp_path / "full"
    assert _run(*_FAST, rounds, f"--output_dir={full}").returncode == 0

    cut = tmp_path / "cut"
    stderr_file = open(tmp_path / "cut.stderr", "w+")  # a file: a full pipe would block the run
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), *_FAST, rounds, f"--output_dir={cut}"],
        stdout=subprocess.PIPE, stderr=stderr_file, text=True, pipesize=4096,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), cwd=SCRIPT.parents[1],
        # A shell without job control starts background jobs with SIGINT ignored, and Python
        # then installs no KeyboardInterrupt handler: give the run the default disposition.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    workers = []
    try:
        for line in proc.stdout:
            workers += [c.pid for c in psutil.Process(proc.pid).children()
                        if "worker_binary" in " ".join(c.cmdline())]
            if line.startswith("round  2/60"):
                proc.send_signal(signal.SIGINT)
                break
        proc.stdout.read()  # unblocks the run, which is now interrupted
        proc.wait(timeout=60)
        stderr_file.seek(0)
        stderr = stderr_file.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        stderr_file.close()
    assert proc.returncode != 0
    assert workers, "the run should have started a TFF worker"
    time.sleep(0.5)
    assert not [p for p in workers if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    done = simulation.read_metrics(cut / "metrics.csv")
    assert 2 <= len(done) < 60
    # Ctrl-C is one line: the last checkpointed round and the command that continues the run.
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    found = re.search(r"interrupted; checkpointed: round (\d+); continue with: ", lines[0])
    assert found and 1 <= int(found.group(1)) <= len(done), lines[0]
    command = shlex.split(lines[0].split("continue with: ", 1)[1])
    assert command[:2] == ["python", "scripts/train.py"] and command[-1] == "--resume"

    resumed = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True,
                             timeout=300, cwd=SCRIPT.parents[1],
                             env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {cut} after round" in resumed.stdout
    assert _rows(cut) == _rows(full)
    # Each sitting's first round and machine (experiments.machine), in the summary too.
    summary = json.loads((cut / "summary.json").read_text())
    assert [s["first_round"] for s in summary["sittings"]] == [1, int(found.group(1)) + 1]
    assert summary["sittings"][-1]["machine"] == summary["machine"]
    assert [s["first_round"] for s in machine.read_sittings(full)] == [1]
    # TensorBoard lost no round either: the interrupted run flushed what it released before
    # exiting, and the resumed run released the rest.
    assert _tensorboard_steps(cut, "train_loss") == set(range(1, 61))


def _tensorboard_steps(output_dir, tag):
    import tensorflow as tf

    steps = set()
    for events in (output_dir / simulation.TENSORBOARD_DIR).glob("events*"):
        for event in tf.data.TFRecordDataset(str(events)).as_numpy_iterator():
            parsed = tf.compat.v1.Event.FromString(event)
            steps |= {parsed.step for value in parsed.summary.value if value.tag == tag}
    return steps


def test_lora_comparison_reports_exact_upload_bytes(tmp_path):
    """Per client per communication round (one metrics row each), from the TFF forms: RoLoRA's B
    round uploads B (r x d_out float32) and its A round A (d_in x r), alternating, FFA-LoRA B,
    FedAvg-LoRA both; each also uploads three float32 metric sums and the float32 weight of the
    (default, example-weighted) mean: 16 bytes. Down: only the federated factors (RoLoRA and
    FedAvg-LoRA A and B, FFA-LoRA B), never the frozen W_out. Digits: d_in = d_out = 64; r = 4."""
    r, d, extra = 4, 64, 16
    proc = _run("--algorithm=rolora,fedavg_lora,ffa_lora", "--rank=4", "--rounds=4",
                "--local_steps=2", "--eval_every=2", f"--output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    rolora = simulation.read_metrics(tmp_path / "rolora" / "metrics.csv")
    fedavg_lora = simulation.read_metrics(tmp_path / "fedavg_lora" / "metrics.csv")
    ffa_lora = simulation.read_metrics(tmp_path / "ffa_lora" / "metrics.csv")
    assert [row["communication_rounds"] for row in rolora] == [1, 2, 3, 4]
    assert [row["communication_rounds"] for row in fedavg_lora] == [1, 2, 3, 4]
    assert ["b_round/client_work/train/loss" in row for row in rolora] == [True, False] * 2
    assert ["a_round/client_work/train/loss" in row for row in rolora] == [False, True] * 2
    assert [row["bytes_up_per_client"] for row in rolora] == [r * d * 4 + extra,
                                                               d * r * 4 + extra] * 2
    assert {row["bytes_down_per_client"] for row in rolora} == {2 * r * d * 4}
    assert ffa_lora[0]["bytes_up_per_client"] == r * d * 4 + extra
    assert ffa_lora[0]["bytes_down_per_client"] == r * d * 4
    assert fedavg_lora[0]["bytes_up_per_client"] == 2 * r * d * 4 + extra
    assert fedavg_lora[0]["bytes_down_per_client"] == 2 * r * d * 4
    table = (tmp_path / "comparison.md").read_text()
    assert all(name in table for name in ("rolora", "fedavg_lora", "ffa_lora"))
    assert (tmp_path / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| rolora | 4 |" in table


def test_flora_with_client_ranks_reports_each_clients_bytes(tmp_path):
    """--client_ranks=1,4 over 4 clients (ranks 1, 4, 1, 4, all in every round), adapters at
    rank 4 (the largest): a rank-k client sends and receives (4 − k)·(64 + 64) float32 fewer than
    the rank-4 types, so per client on average 1.5·128·4 bytes fewer: up A and B (2·4·64 floats)
    + 16 bytes; down A, B and the linked 64×64 base kernel FLoRA merges into."""
    proc = _run("--algorithm=flora", "--client_ranks=1,4", "--num_clients=4",
                "--clients_per_round=4", "--rounds=2", "--local_steps=2", "--eval_every=2",
                f"--output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    rows = simulation.read_metrics(tmp_path / "metrics.csv")
    saved = 1.5 * 128 * 4
    assert [row["bytes_up_per_client"] for row in rows] == [2 * 4 * 64 * 4 + 16 - saved] * 2
    assert [row["bytes_down_per_client"] for row in rows] == [
        (2 * 4 * 64 + 64 * 64) * 4 - saved] * 2
    assert "r=4" in proc.stdout


@pytest.mark.slow
def test_minilm_rolora_sends_adapters_not_the_backbone(tmp_path, shared_data):
    """The issue's acceptance command: RoLoRA on SST-2 with the pretrained all-MiniLM-L6-v2
    (22.7M frozen parameters, about 91 MB) broadcasts only the LoRA factors and the head:
    12 adapters (query, value of 6 layers) of r = 16 on 384 x 384, and the 384 x 2 head,
    (12 * 2 * 384 * 16 + 384 * 2 + 2) * 4 = 592,904 bytes, far below 1 MB."""
    from models import checkpoints

    try:
        checkpoints.fetch_minilm()
    except Exception as e:
        pytest.skip(f"all-MiniLM-L6-v2 unavailable: {e}")
    proc = _run("--task=sst2", "--backbone=minilm", "--algorithm=rolora", "--rounds=1",
                "--num_clients=2", "--clients_per_round=2", "--local_steps=1",
                f"--data_dir={shared_data}", f"--output_dir={tmp_path}", timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert "2 clients per round, 1 communication round ->" in proc.stdout   # singular, not "1 …s"
    assert "done: rolora 1 communication round;" in proc.stdout
    (row,) = _rows(tmp_path)
    assert row["bytes_down_per_client"] == (12 * 2 * 384 * 16 + 384 * 2 + 2) * 4
    assert row["bytes_down_per_client"] < 1_000_000
    assert row["bytes_up_per_client"] == (12 * 16 * 384 + 384 * 2 + 2) * 4 + 16   # B round
    state = next((tmp_path / "checkpoints").iterdir()) / "state.npz"
    assert state.stat().st_size < 2_000_000   # the checkpoint holds no backbone either


def test_fedsa_lora_reports_personalized_test_accuracy_and_evaluate_only_restores_it(
        tmp_path, shared_data):
    """FedSA-LoRA on SST-2 with --eval_test reports its personalized accuracy on the labeled test
    split cut per client (eval_personal_test_*) beside the dev shards'. --evaluate_only on the
    finished run trains nothing: it recomputes every metric from the last checkpoint (equal to
    the run's own, so the checkpoint restores shared and personal state) and adds the ones
    summary.json lacks, as for a run from before the test split was cut."""

    args = ["--task=sst2", "--algorithm=fedsa_lora", "--eval_test", "--rounds=2",
            "--num_clients=3", "--clients_per_round=3", "--local_steps=1", "--rank=2",
            "--sequence_length=16", "--eval_every=0", f"--data_dir={shared_data}",
            f"--output_dir={tmp_path}"]
    proc = _run(*args, timeout=900)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    final = summary["final"]
    personal = {k: v for k, v in final.items() if k.startswith("eval_personal")}
    assert {"eval_personal_accuracy", "eval_personal_test_accuracy",
            "eval_personal_test_loss", "eval_personal_test_mean_client_accuracy"} <= set(personal)
    # Pooled accuracies: correct sentences over all 1,821 test / 872 dev sentences, each scored
    # by the model of the client whose shard holds it.
    for key, size in (("eval_personal_test_accuracy", 1821), ("eval_personal_accuracy", 872)):
        assert final[key] * size == pytest.approx(round(final[key] * size), abs=1e-3), key
    assert "eval_accuracy" not in final   # B is personal: no global model
    older = [k for k in personal if k.startswith("eval_personal_test_")]
    for key in older:
        del final[key]
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    rows = _rows(tmp_path)

    again = _run(*args, "--evaluate_only", timeout=900)
    assert again.returncode == 0, again.stderr
    assert "evaluated round 2 of" in again.stdout and "round 1/" not in again.stdout
    restored = json.loads((tmp_path / "summary.json").read_text())
    assert restored["evaluated_later"]["added"] == sorted(older)
    assert restored["evaluated_later"]["max_abs_difference_of_held_metrics"] <= 1e-6
    for key, value in personal.items():
        assert restored["final"][key] == pytest.approx(value, abs=1e-6), key
    evaluation = json.loads((tmp_path / "evaluation.json").read_text())
    assert evaluation["round"] == 2 and set(evaluation["metrics"]) == set(personal)
    assert _rows(tmp_path) == rows   # nothing trained or rewritten


def test_fedrep_with_srpfl_participation(tmp_path):
    """FedRep on the MLP's split: SRPFL takes the fastest 2, 4, then all 6 clients (stages of 2
    rounds), reports the simulated clock, uploads only the representation, and evaluates every
    client on its own test set with its own head."""
    proc = _run("--algorithm=fedrep", "--participation=srpfl", "--num_clients=6",
                "--clients_per_round=6", "--initial_participants=2", "--stage_rounds=2",
                "--rounds=5", "--local_steps=2", "--head_epochs=2", "--learning_rate=0.1",
                "--eval_every=5", f"--output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    rows = _rows(tmp_path)
    assert [r["participants"] for r in rows] == [2, 2, 4, 4, 6]
    assert [r["clients"] for r in rows] == [2, 2, 4, 4, 6]
    times = [r["simulated_time"] for r in rows]
    assert all(b > a for a, b in zip(times, times[1:]))
    # MLP 64-32-16-10: the representation is the two hidden layers; the head never goes up.
    representation = 64 * 32 + 32 + 32 * 16 + 16
    assert rows[0]["bytes_up_per_client"] == representation * 4 + 3 * 4 + 4
    assert 0.0 <= rows[-1]["eval_personal_accuracy"] <= 1.0
    assert "eval_accuracy" not in rows[-1]  # no global model to test: heads are personal
    assert "personalized test accuracy" in proc.stdout


def test_adaptpfl_variant_b_runs_and_its_switches_enter_the_run_configuration(tmp_path):
    """AdaptPFL variant B end to end on the digits MLP (shortcut 64×10, W 64×32): the shortcut
    and the head stay personal (only the representation goes up), and the variant and its
    switches name the run (--resume refuses a checkpoint of another configuration)."""
    args = ["--algorithm=adaptpfl", "--adaptpfl_variant=b", "--shortcut_damping=0.5",
            "--shortcut_ridge=0.01", "--num_clients=4", "--clients_per_round=4", "--rounds=2",
            "--local_steps=2", "--eval_every=2", "--learning_rate=0.1"]
    proc = _run(*args, f"--output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    rows = _rows(tmp_path)
    representation = 64 * 32 + 32 + 32 * 16 + 16
    assert rows[0]["bytes_up_per_client"] == representation * 4 + 3 * 4 + 4
    assert 0.0 <= rows[-1]["eval_personal_accuracy"] <= 1.0
    # The checkpoint's configuration, which --resume compares (tffl.simulation.driver).

    meta = json.loads(next(tmp_path.glob("**/meta.json")).read_text())
    assert {k: meta["config"].get(k) for k in ("adaptpfl_variant", "shortcut_damping",
                                               "shortcut_ridge", "head_damping")} == {
        "adaptpfl_variant": "b", "shortcut_damping": 0.5, "shortcut_ridge": 0.01,
        "head_damping": None}  # at its default: absent, so that older runs still resume


def test_fedrep_heads_over_rolora_adapters_on_the_review_domains(tmp_path, shared_data):
    """Experiment 4's shape at toy scale: the five review domains as clients, a tiny BERT with
    LoRA on query/value (2 layers, width 64), FedRep heads, adapters averaged RoLoRA-style."""
    from models import checkpoints

    try:
        checkpoints.fetch_minilm()  # its vocabulary tokenizes the reviews
    except Exception as e:
        pytest.skip(f"all-MiniLM-L6-v2 vocabulary unavailable: {e}")
    proc = _run("--task=reviews", "--backbone=tiny", "--algorithm=fedrep",
                "--representation=lora_alternating", "--num_clients=5", "--clients_per_round=5",
                "--rounds=2", "--local_steps=2", "--batch_size=4", "--sequence_length=16",
                "--rank=4", "--head_epochs=1", "--learning_rate=0.1", "--eval_every=1",
                f"--data_dir={shared_data}", f"--output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    rows = _rows(tmp_path)
    assert [r["communication_rounds"] for r in rows] == [1, 2]
    # B round: the four B factors (r x 64) go up, A round the four A factors (64 x r); the heads
    # never do. Plus 3 metric floats and the weight of the weighted mean. Down: A and B only.
    assert "b_round/client_work/train/loss" in rows[0]
    assert "a_round/client_work/train/loss" in rows[1]
    assert rows[0]["bytes_up_per_client"] == 4 * 4 * 64 * 4 + 16
    assert rows[1]["bytes_up_per_client"] == 4 * 64 * 4 * 4 + 16
    assert rows[0]["bytes_down_per_client"] == rows[1]["bytes_down_per_client"] == 2 * 4 * 4 * 64 * 4
    assert 0.0 <= rows[1]["eval_personal_accuracy"] <= 1.0


# --- Several TFF workers (tffl.runtime, docs/runtime.md) ----------------------------------------

def test_unreachable_worker_address_is_one_clear_line(tmp_path):
    import portpicker

    address = f"localhost:{portpicker.pick_unused_port()}"
    proc = _run(*_FAST, "--rounds=2", f"--worker_addresses={address}", "--worker_timeout=1",
                f"--output_dir={tmp_path}", timeout=120)
    assert proc.returncode == 3
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"TFF worker #0 at {address} was not ready after 1 s" in err[0]


def _watched_run(*args, kill_after_round=None):
    """Runs train.py; with `kill_after_round`, SIGKILLs its last TFF worker once that round's
    progress line is printed. Returns (process, stderr, the workers' pids); checks that no worker
    outlives the run."""
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    workers = set()
    try:
        for line in proc.stdout:
            for child in psutil.Process(proc.pid).children():
                with contextlib.suppress(psutil.Error):  # e.g. a killed worker, not yet reaped
                    if "worker_binary" in " ".join(child.cmdline()):
                        workers.add(child.pid)
            if kill_after_round and line.split("/")[0].split() == ["round", str(kill_after_round)]:
                os.kill(max(workers), signal.SIGKILL)
                kill_after_round = None
        stderr = proc.stderr.read()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()
    time.sleep(0.5)
    assert not [p for p in workers if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    return proc, stderr, workers


def _assert_rows_close(a, b):
    assert [r["round"] for r in a] == [r["round"] for r in b]
    for row_a, row_b in zip(a, b):
        assert set(row_a) == set(row_b)
        for key in row_a:
            assert row_a[key] == pytest.approx(row_b[key], rel=1e-5, abs=1e-6), key


_WORKER_ROUNDS = "--rounds=8"


@pytest.fixture(scope="module")
def one_worker_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("one_worker")
    proc = _run(*_FAST, _WORKER_ROUNDS, f"--output_dir={out}")
    assert proc.returncode == 0, proc.stderr
    return _rows(out)


def test_two_workers_match_one_worker(one_worker_run, tmp_path):
    proc, stderr, workers = _watched_run(*_FAST, _WORKER_ROUNDS, "--workers=2",
                                         f"--output_dir={tmp_path}")
    assert proc.returncode == 0, stderr
    assert len(workers) == 2
    assert (tmp_path / "tff_worker_0.log").exists() and (tmp_path / "tff_worker_1.log").exists()
    _assert_rows_close(_rows(tmp_path), one_worker_run)


def test_killed_worker_stops_the_run_and_resume_completes_it(one_worker_run, tmp_path):
    proc, stderr, workers = _watched_run(*_FAST, _WORKER_ROUNDS, "--workers=2",
                                         f"--output_dir={tmp_path}", kill_after_round=2)
    assert proc.returncode == 3, stderr
    err = [line for line in stderr.splitlines() if line.startswith("train.py: error:")]
    assert len(err) == 1 and "Traceback" not in stderr, stderr
    assert f"(pid {max(workers)}, localhost:" in err[0] and "killed by SIGKILL" in err[0]
    assert f"log {tmp_path}/tff_worker_" in err[0] and "--resume" in err[0]
    done = simulation.read_metrics(tmp_path / "metrics.csv")
    assert 2 <= len(done) < 8

    proc, stderr, _ = _watched_run(*_FAST, _WORKER_ROUNDS, "--workers=2",
                                   f"--output_dir={tmp_path}", "--resume")
    assert proc.returncode == 0, stderr
    _assert_rows_close(_rows(tmp_path), one_worker_run)


def test_in_process_runtime_on_two_logical_cpus_matches_one_worker(one_worker_run, tmp_path):
    """--runtime=distribute: the same rounds in this process, the clients split over two
    logical CPU devices by MirroredStrategy, and no TFF worker started."""
    proc, stderr, workers = _watched_run(*_FAST, _WORKER_ROUNDS, "--runtime=distribute",
                                         "--logical_cpus=2", "--devices=CPU:0,CPU:1",
                                         f"--output_dir={tmp_path}")
    assert proc.returncode == 0, stderr
    assert workers == set()
    _assert_rows_close(_rows(tmp_path), one_worker_run)
