"""scripts/train.py end to end on text (SST-2 with MiniLM, the review domains with a tiny BERT),
in this process (`scripts.train.run_command_line`): the large tier (`pytest -m large`). The runs
check mechanics (bytes, metrics, checkpoints), so they read every k-th row of the real data
(`sample_data`)."""

import json

import pytest

from tests.scripts import train_runs

pytestmark = pytest.mark.large
_run = train_runs.run_in_process


def test_minilm_rolora_sends_adapters_not_the_backbone(tmp_path, sample_data, capsys):
    """The issue's acceptance command: RoLoRA on SST-2 with the pretrained all-MiniLM-L6-v2
    (22.7M frozen parameters, about 91 MB) broadcasts only the LoRA factors and the head:
    12 adapters (query, value of 6 layers) of r = 16 on 384 x 384, and the 384 x 2 head,
    (12 * 2 * 384 * 16 + 384 * 2 + 2) * 4 = 592,904 bytes, far below 1 MB. The bytes do not
    depend on the data or the sequence length: a sample of SST-2 (`sample_data`) cut at 32 tokens
    spares tokenizing 70k sentences and running whole ones through MiniLM."""
    from models import checkpoints

    try:
        checkpoints.fetch_minilm()
    except Exception as e:
        pytest.skip(f"all-MiniLM-L6-v2 unavailable: {e}")
    proc = _run(capsys, "--task=sst2", "--backbone=minilm", "--algorithm=rolora", "--rounds=1",
                "--num_clients=2", "--clients_per_round=2", "--local_steps=1", "--sequence_length=32",
                f"--data_dir={sample_data}", f"--output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert "2 clients per round, 1 communication round ->" in proc.stdout   # singular, not "1 …s"
    assert "done: rolora 1 communication round;" in proc.stdout
    (row,) = train_runs.rows(tmp_path)
    assert row["bytes_down_per_client"] == (12 * 2 * 384 * 16 + 384 * 2 + 2) * 4
    assert row["bytes_down_per_client"] < 1_000_000
    assert row["bytes_up_per_client"] == (12 * 16 * 384 + 384 * 2 + 2) * 4 + 16   # B round
    state = next((tmp_path / "checkpoints").iterdir()) / "state.npz"
    assert state.stat().st_size < 2_000_000   # the checkpoint holds no backbone either


def test_fedsa_lora_reports_personalized_test_accuracy_and_evaluate_only_restores_it(
        tmp_path, sample_data, capsys):
    """FedSA-LoRA on SST-2 with --eval_test reports its personalized accuracy on the labeled test
    split cut per client (eval_personal_test_*) beside the dev shards'. --evaluate_only on the
    finished run trains nothing: it recomputes every metric from the last checkpoint (equal to
    the run's own, so the checkpoint restores shared and personal state) and adds the ones
    summary.json lacks, as for a run from before the test split was cut. On a sample of SST-2
    (`sample_data`): the split sizes are counted from its files."""

    args = ["--task=sst2", "--algorithm=fedsa_lora", "--eval_test", "--rounds=2",
            "--num_clients=3", "--clients_per_round=3", "--local_steps=1", "--rank=2",
            "--sequence_length=16", "--eval_every=0", f"--data_dir={sample_data}",
            f"--output_dir={tmp_path}"]
    proc = _run(capsys, *args)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    final = summary["final"]
    personal = {k: v for k, v in final.items() if k.startswith("eval_personal")}
    assert {"eval_personal_accuracy", "eval_personal_test_accuracy",
            "eval_personal_test_loss", "eval_personal_test_mean_client_accuracy"} <= set(personal)
    # Pooled accuracies: correct sentences over all the test / dev sentences, each scored by the
    # model of the client whose shard holds it.
    sizes = {split: len((sample_data / "sst2" / f"{split}.tsv").read_text().splitlines()) - 1
             for split in ("test-labeled", "dev")}
    for key, size in (("eval_personal_test_accuracy", sizes["test-labeled"]),
                      ("eval_personal_accuracy", sizes["dev"])):
        assert final[key] * size == pytest.approx(round(final[key] * size), abs=1e-3), key
    assert "eval_accuracy" not in final   # B is personal: no global model
    older = [k for k in personal if k.startswith("eval_personal_test_")]
    for key in older:
        del final[key]
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    rows = train_runs.rows(tmp_path)

    again = _run(capsys, *args, "--evaluate_only")
    assert again.returncode == 0, again.stderr
    assert "evaluated round 2 of" in again.stdout and "round 1/" not in again.stdout
    restored = json.loads((tmp_path / "summary.json").read_text())
    assert restored["evaluated_later"]["added"] == sorted(older)
    assert restored["evaluated_later"]["max_abs_difference_of_held_metrics"] <= 1e-6
    for key, value in personal.items():
        assert restored["final"][key] == pytest.approx(value, abs=1e-6), key
    evaluation = json.loads((tmp_path / "evaluation.json").read_text())
    assert evaluation["round"] == 2 and set(evaluation["metrics"]) == set(personal)
    assert train_runs.rows(tmp_path) == rows   # nothing trained or rewritten


def test_fedrep_heads_over_rolora_adapters_on_the_review_domains(tmp_path, sample_data, capsys):
    """Experiment 4's shape at toy scale: the five review domains as clients (a sample of their
    reviews, `sample_data`), a tiny BERT with LoRA on query/value (2 layers, width 64), FedRep
    heads, adapters averaged RoLoRA-style."""
    from models import checkpoints

    try:
        checkpoints.fetch_minilm()  # its vocabulary tokenizes the reviews
    except Exception as e:
        pytest.skip(f"all-MiniLM-L6-v2 vocabulary unavailable: {e}")
    proc = _run(capsys, "--task=reviews", "--backbone=tiny", "--algorithm=fedrep",
                "--representation=lora_alternating", "--num_clients=5", "--clients_per_round=5",
                "--rounds=2", "--local_steps=2", "--batch_size=4", "--sequence_length=16",
                "--rank=4", "--head_epochs=1", "--learning_rate=0.1", "--eval_every=0",
                f"--data_dir={sample_data}", f"--output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    rows = train_runs.rows(tmp_path)
    assert [r["communication_rounds"] for r in rows] == [1, 2]
    # B round: the four B factors (r x 64) go up, A round the four A factors (64 x r); the heads
    # never do. Plus 3 metric floats and the weight of the weighted mean. Down: A and B only.
    assert "b_round/client_work/train/loss" in rows[0]
    assert "a_round/client_work/train/loss" in rows[1]
    assert rows[0]["bytes_up_per_client"] == 4 * 4 * 64 * 4 + 16
    assert rows[1]["bytes_up_per_client"] == 4 * 64 * 4 * 4 + 16
    assert rows[0]["bytes_down_per_client"] == rows[1]["bytes_down_per_client"] == 2 * 4 * 4 * 64 * 4
    assert 0.0 <= rows[1]["eval_personal_accuracy"] <= 1.0


def test_rolora_instruction_tunes_a_decoder_from_the_readme_flags(tmp_path, sample_data, capsys):
    """`--task=sst2_instruct --backbone=gpt2_tiny --algorithm=rolora` (README's flags): the tiny
    GPT-2's LoRA factors travel, r = 16 on query and value of 2 layers of width 64: down A and
    B, 4 * 2 * 16 * 64 * 4 = 32,768 bytes; up the B round's B factors, 16,384 bytes and the
    metric sums (16). The evaluation reports generation and likelihood accuracy."""
    args = ["--task=sst2_instruct", "--backbone=gpt2_tiny", "--algorithm=rolora", "--rounds=2",
            "--num_clients=2", "--clients_per_round=2", "--local_steps=1", "--batch_size=4",
            f"--data_dir={sample_data}", f"--output_dir={tmp_path}"]
    proc = _run(capsys, *args)
    assert proc.returncode == 0, proc.stderr
    assert "tiny random GPT-2 over bytes (a test backbone), LoRA r=16 on query,value" in proc.stdout
    first, second = train_runs.rows(tmp_path)
    assert first["bytes_down_per_client"] == 4 * 2 * 16 * 64 * 4
    assert first["bytes_up_per_client"] == 4 * 16 * 64 * 4 + 16
    names = ("eval_accuracy", "eval_likelihood_accuracy", "eval_token_accuracy",
             "eval_unparseable")
    for name in names:
        assert 0 <= second[name] <= 1, name
    assert second["eval_loss"] > 0
