"""Tests for tasks.benchmark_text on a tiny GLUE-layout folder (no timing assertions)."""

import sys

import pytest


def test_frequency_vocabulary_order():
    from tasks import benchmark_text

    vocab = benchmark_text.frequency_vocabulary(["b a A", "c a b [PAD]"], 3)
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert vocab[5:] == ["a", "b", "[pad]"]  # counts a:3, b:2, then ties by name: [pad] < c


def test_main_reports_every_stage(tmp_path, tf_text, capsys):
    from tasks import benchmark_text

    rows = "\n".join(f"sentence number {i} is {'good' if i % 2 else 'bad'}\t{i % 2}"
                     for i in range(40))
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + rows + "\n")
    figures = benchmark_text.main(["--data_dir", str(tmp_path), "--num_clients", "4",
                                   "--sequence_length", "8"])
    out = capsys.readouterr().out
    assert "SST-2 train: 40 examples -> 4 clients (dirichlet)" in out
    for stage in ("load_tsv", "build_vocab", "tokenize", "partition", "client_data",
                  "first_batches", "total"):
        assert stage in out and figures[stage] >= 0
    assert figures["total"] == pytest.approx(
        sum(v for k, v in figures.items() if k != "total"), rel=1e-6)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
