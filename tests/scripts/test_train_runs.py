"""scripts/train.py end to end on the digits, in this process (`scripts.train.run_command_line`):
its outputs, the refusal to overwrite a run, the exact bytes of the LoRA algorithms, personalized
algorithms and SRPFL participation."""

import json
import os

from runner import machine
from tests.scripts import train_runs
from tffl.simulation import metrics_log

_run = train_runs.run_in_process


def test_job_writes_results_and_refuses_to_overwrite(tmp_path, capsys):
    proc = _run(capsys, *train_runs.FAST, "--rounds=3", f"--output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert "done: fedavg 3 communication rounds" in proc.stdout and "round 3/3" in proc.stdout
    rows = train_runs.rows(tmp_path)
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert rows[-1]["bytes_up_per_client"] > 0 and "eval_accuracy" in rows[-1]
    summary = json.loads((tmp_path / "summary.json").read_text())
    # The machine the run ran on (runner.machine), for tracing a rerun's float differences.
    assert summary["machine"]["cpus"] == os.cpu_count() and summary["machine"]["cpu"]
    again = _run(capsys, *train_runs.FAST, "--rounds=3", f"--output_dir={tmp_path}")
    assert again.returncode == 2 and "--resume" in again.stderr
    assert train_runs.rows(tmp_path) == rows  # nothing overwritten
    # --evaluate_only with other flags than the run's names itself, not --resume.
    other = _run(capsys, *train_runs.FAST, "--rounds=3", "--learning_rate=0.2",
                 f"--output_dir={tmp_path}", "--evaluate_only")
    message = other.stderr.strip().splitlines()
    assert other.returncode == 2 and len(message) == 1, other.stderr
    assert "--evaluate_only" in message[0] and "learning_rate" in message[0], message
    assert train_runs.rows(tmp_path) == rows and not (tmp_path / "evaluation.json").exists()
    # A damaged legs record stops a resumed run in one line before it trains a round.
    with open(tmp_path / machine.LEGS_FILE, "a") as f:
        f.write("not json\n")
    damaged = _run(capsys, *train_runs.FAST, "--rounds=4", f"--output_dir={tmp_path}", "--resume")
    message = damaged.stderr.strip().splitlines()
    assert damaged.returncode == 1 and len(message) == 1, damaged.stderr
    assert "legs.jsonl, line 2: not a recorded leg" in message[0], message
    assert train_runs.rows(tmp_path) == rows


def test_lora_comparison_reports_exact_upload_bytes(tmp_path, capsys):
    """Per client per communication round (one metrics row each), from the TFF forms: RoLoRA's B
    round uploads B (r x d_out float32) and its A round A (d_in x r), alternating, FFA-LoRA B,
    FedAvg-LoRA both; each also uploads three float32 metric sums and the float32 weight of the
    (default, example-weighted) mean: 16 bytes. Down: only the federated factors (RoLoRA and
    FedAvg-LoRA A and B, FFA-LoRA B), never the frozen W_out. Digits: d_in = d_out = 64; r = 4."""
    r, d, extra = 4, 64, 16
    proc = _run(capsys, "--algorithm=rolora,fedavg_lora,ffa_lora", "--rank=4", "--rounds=4",
                "--local_steps=2", "--eval_every=2", f"--output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    rolora = metrics_log.read_metrics(tmp_path / "rolora" / "metrics.csv")
    fedavg_lora = metrics_log.read_metrics(tmp_path / "fedavg_lora" / "metrics.csv")
    ffa_lora = metrics_log.read_metrics(tmp_path / "ffa_lora" / "metrics.csv")
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


def test_flora_with_client_ranks_reports_each_clients_bytes(tmp_path, capsys):
    """--client_ranks=1,4 over 4 clients (ranks 1, 4, 1, 4, all in every round), adapters at
    rank 4 (the largest): a rank-k client sends and receives (4 − k)·(64 + 64) float32 fewer than
    the rank-4 types, so per client on average 1.5·128·4 bytes fewer: up A and B (2·4·64 floats)
    + 16 bytes; down A, B and the linked 64×64 base kernel FLoRA merges into."""
    proc = _run(capsys, "--algorithm=flora", "--client_ranks=1,4", "--num_clients=4",
                "--clients_per_round=4", "--rounds=2", "--local_steps=2", "--eval_every=2",
                f"--output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    rows = metrics_log.read_metrics(tmp_path / "metrics.csv")
    saved = 1.5 * 128 * 4
    assert [row["bytes_up_per_client"] for row in rows] == [2 * 4 * 64 * 4 + 16 - saved] * 2
    assert [row["bytes_down_per_client"] for row in rows] == [
        (2 * 4 * 64 + 64 * 64) * 4 - saved] * 2
    assert "r=4" in proc.stdout


def test_fedrep_with_srpfl_participation(tmp_path, capsys):
    """FedRep on the MLP's split: SRPFL takes the fastest 2, 4, then all 6 clients (stages of 2
    rounds), reports the simulated clock, uploads only the representation, and evaluates every
    client on its own test set with its own head."""
    proc = _run(capsys, "--algorithm=fedrep", "--participation=srpfl", "--num_clients=6",
                "--clients_per_round=6", "--initial_participants=2", "--stage_rounds=2",
                "--rounds=5", "--local_steps=2", "--head_epochs=2", "--learning_rate=0.1",
                "--eval_every=5", f"--output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    rows = train_runs.rows(tmp_path)
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


def test_adaptpfl_variant_b_runs_and_its_switches_enter_the_run_configuration(tmp_path, capsys):
    """AdaptPFL variant B end to end on the digits MLP (shortcut 64×10, W 64×32): the shortcut
    and the head stay personal (only the representation goes up), and the variant and its
    switches name the run (--resume refuses a checkpoint of another configuration)."""
    args = ["--algorithm=adaptpfl", "--adaptpfl_variant=b", "--shortcut_damping=0.5",
            "--shortcut_ridge=0.01", "--num_clients=4", "--clients_per_round=4", "--rounds=2",
            "--local_steps=2", "--eval_every=2", "--learning_rate=0.1"]
    proc = _run(capsys, *args, f"--output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    rows = train_runs.rows(tmp_path)
    representation = 64 * 32 + 32 + 32 * 16 + 16
    assert rows[0]["bytes_up_per_client"] == representation * 4 + 3 * 4 + 4
    assert 0.0 <= rows[-1]["eval_personal_accuracy"] <= 1.0
    # The checkpoint's configuration, which --resume compares (tffl.simulation.driver).

    meta = json.loads(next(tmp_path.glob("**/meta.json")).read_text())
    assert {k: meta["config"].get(k) for k in ("adaptpfl_variant", "shortcut_damping",
                                               "shortcut_ridge", "head_damping")} == {
        "adaptpfl_variant": "b", "shortcut_damping": 0.5, "shortcut_ridge": 0.01,
        "head_damping": None}  # at its default: absent, so that older runs still resume
