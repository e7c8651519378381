"""scripts/train.py on the user's own data, one command each, in this process: a CSV with a
client column and a TFDS dataset by name (mock data), each comparing two algorithms (the
comparison table and plot); a sentence-pair TSV and Alpaca JSON on gpt2_tiny, one algorithm each
(the data's path is what they test). Bad files are one line each."""

import json

import numpy as np
import pytest

from tests.scripts import train_runs

_run = train_runs.run_in_process
_FAST = ["--rounds=2", "--local_steps=1", "--batch_size=4", "--eval_every=1", "--rank=2"]


def _reviews(path, n, seed, users=("ann", "bob", "cy")):
    rng = np.random.default_rng(seed)
    good, bad = ["a joy", "great fun", "warm, witty"], ["dull", "too long", "a mess"]
    lines = ["review,sentiment,user"]
    for _ in range(n):
        label = str(rng.choice(["pos", "neg"]))
        text = str(rng.choice(good if label == "pos" else bad))
        lines.append(f'"{text}",{label},{rng.choice(users)}')
    path.write_text("\n".join(lines) + "\n")


def _compared(proc, folder, algorithms):
    """Several algorithms: the comparison table, plot and a run folder each; one: its run."""
    assert proc.returncode == 0, proc.stderr
    if len(algorithms) == 1:
        assert f"done: {algorithms[0]} 2 communication rounds;" in proc.stdout
        assert (folder / "summary.json").is_file() and (folder / "metrics.csv").is_file()
        return
    header = proc.stdout.split("| algorithm |")[1].splitlines()[0]
    assert "dev acc (final)" in header, header
    for name in algorithms:
        assert f"\n| {name} | 2 |" in proc.stdout
        assert (folder / name / "summary.json").is_file()
    assert (folder / "comparison.png").stat().st_size > 0
    assert (folder / "comparison.md").read_text().count("\n| ") == len(algorithms) + 1


@pytest.mark.large
def test_a_csv_with_a_client_column_compares_rolora_and_fedavg_lora_keeping_every_prediction(
        tmp_path, capsys, monkeypatch):
    """One comparison on a CSV with a client column, a dev and a labeled test file
    (--eval_test): the table, the plot, the labels; and each run's predictions.npz holds each
    evaluation's predicted class of every dev and test row (in the files' row order, whatever
    the batches' order), and the labels: their agreement is the accuracy the run reports for
    that round, and the labels are the files' own, encoded."""
    from tffl.simulation.predictions import read_predictions

    _reviews(tmp_path / "train.csv", 40, 0)
    _reviews(tmp_path / "dev.csv", 12, 1)
    _reviews(tmp_path / "test.csv", 15, 2)
    out = tmp_path / "run"
    # The note is said once per process: as if no earlier test of this process had said it.
    monkeypatch.setattr("runner.training._WARNED", set())
    proc = _run(capsys, "--task=text", f"--train_file={tmp_path / 'train.csv'}",
                f"--dev_file={tmp_path / 'dev.csv'}", f"--test_file={tmp_path / 'test.csv'}",
                "--eval_test", "--text_column=review", "--label_column=sentiment",
                "--client_column=user", "--algorithm=rolora,fedavg_lora",
                "--clients_per_round=2", *_FAST, f"--output_dir={out}")
    _compared(proc, out, ("rolora", "fedavg_lora"))
    assert "train.csv (40 train examples, 3 clients, 2 classes;" in proc.stdout
    assert proc.stdout.count("--backbone=tiny is a random network") == 1
    labels = json.loads((out / "rolora" / "labels.json").read_text())["labels"]
    assert labels == ["neg", "pos"]
    for name in ("rolora", "fedavg_lora"):
        rounds, labels = read_predictions(out / name)
        assert sorted(rounds) == [1, 2]
        for split, path in (("eval", "dev.csv"), ("test", "test.csv")):
            rows = (tmp_path / path).read_text().splitlines()[1:]
            expected = [0 if line.rsplit(",", 2)[1] == "neg" else 1 for line in rows]
            assert labels[split].tolist() == expected
        metrics = train_runs.rows(out / name)
        assert [row["round"] for row in metrics] == [1, 2]
        for row in metrics:
            predicted = rounds[row["round"]]
            assert np.mean(predicted["eval"] == labels["eval"]) == pytest.approx(
                row["eval_accuracy"], abs=1e-6)
            assert np.mean(predicted["test"] == labels["test"]) == pytest.approx(
                row["eval_test_accuracy"], abs=1e-6)


@pytest.mark.large
def test_a_sentence_pair_tsv(tmp_path, capsys):
    rng = np.random.default_rng(2)
    words = ["a", "man", "dog", "runs", "sleeps", "the", "park"]
    rows = ["premise\thypothesis\tlabel"] + [
        f"{' '.join(rng.choice(words, 4))}\t{' '.join(rng.choice(words, 3))}\t"
        f"{rng.choice(['entailment', 'neutral', 'contradiction'])}" for _ in range(30)]
    (tmp_path / "pairs.tsv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "run"
    proc = _run(capsys, "--task=text", f"--train_file={tmp_path / 'pairs.tsv'}",
                "--text_column=premise", "--text_pair_column=hypothesis", "--partition=iid",
                "--num_clients=3", "--clients_per_round=3", "--algorithm=ffa_lora",
                *_FAST, f"--output_dir={out}")
    _compared(proc, out, ("ffa_lora",))
    assert "sentence pairs, 3 clients, 3 classes" in proc.stdout
    assert json.loads((out / "labels.json").read_text())["labels"] == [
        "contradiction", "entailment", "neutral"]


@pytest.mark.large
def test_alpaca_json_on_gpt2_tiny(tmp_path, capsys):
    rng = np.random.default_rng(3)
    rows = [{"instruction": "Add the numbers.", "input": f"{a} and {b}", "output": str(a + b),
             "user": str(rng.choice(["u1", "u2"]))}
            for a, b in rng.integers(0, 9, size=(24, 2)).tolist()]
    (tmp_path / "alpaca.json").write_text(json.dumps(rows, indent=1))
    out = tmp_path / "run"
    proc = _run(capsys, "--task=instruct", "--backbone=gpt2_tiny",
                f"--train_file={tmp_path / 'alpaca.json'}", "--client_column=user",
                "--algorithm=fedavg_lora", "--clients_per_round=2", *_FAST,
                f"--output_dir={out}")
    _compared(proc, out, ("fedavg_lora",))
    final = json.loads((out / "summary.json").read_text())["final"]
    assert {"eval_loss", "eval_token_accuracy", "eval_accuracy"} <= set(final)


@pytest.mark.large
def test_a_tfds_dataset_by_name_with_mock_data(tmp_path, capsys):
    tfds = pytest.importorskip("tensorflow_datasets")
    import tensorflow_datasets.testing  # noqa: F401

    out = tmp_path / "run"
    with tfds.testing.mock_data(num_examples=20):
        proc = _run(capsys, "--task=text", "--tfds_name=imdb_reviews",
                    "--tfds_splits=train,test", "--partition=iid", "--num_clients=2",
                    "--clients_per_round=2", "--sequence_length=16",
                    "--algorithm=fedavg_lora,ffa_lora", *_FAST, f"--output_dir={out}")
    assert proc.returncode == 0, proc.stderr
    assert "tfds:imdb_reviews (" in proc.stdout
    assert "test acc (final)" in proc.stdout   # the split TFDS names the dev rows
    assert (out / "comparison.png").is_file()


@pytest.mark.parametrize("files, message", [
    ({"train.csv": "text,y\ngood,1\n"},
     "train.csv: no column 'label' (its columns: text, y); name the label column with "
     "--label_column=<one of them>"),
    ({"train.csv": "text,label,user\ngood,1,ann\nbad,0,\n"},
     "train.csv: line 3, column 'user': empty client"),
    ({"train.csv": "text,label\ngood,1\nbad,0\n", "dev.csv": "text,label\nfine,2\n"},
     "dev.csv: line 2, column 'label': label '2' does not occur in the training rows (their "
     "labels: 0, 1)"),
    ({"train.csv": b"text,label\ngood,1\ncaf\xe9,0\n"},
     "train.csv: line 3: not UTF-8 (byte 0xe9 at column 4); save the file as UTF-8"),
    ({"train.jsonl": '{"text": "good", "label": 1}\n{"text": "bad" "label": 0}\n'},
     "train.jsonl: line 2, column 16: JSON syntax error: Expecting ',' delimiter"),
])
def test_a_bad_file_is_one_line_naming_file_line_and_column(files, message, tmp_path, capsys):
    for name, content in files.items():
        path = tmp_path / name
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    train = next(n for n in files if n.startswith("train"))
    args = ["--task=text", f"--train_file={tmp_path / train}", "--algorithm=rolora",
            "--clients_per_round=1", f"--output_dir={tmp_path / 'run'}"]
    if "user" in str(files[train]):
        args.append("--client_column=user")
    else:
        args += ["--partition=iid", "--num_clients=1"]
    if "dev.csv" in files:
        args.append(f"--dev_file={tmp_path / 'dev.csv'}")
    proc = _run(capsys, *args)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error: "), proc.stderr
    assert message in lines[0], lines[0]
