"""Tests for tasks.benchmark_text on a tiny GLUE-layout folder (no timing assertions)."""


import pytest


def test_frequency_vocabulary_order():
    from tasks import benchmark_text

    vocab = benchmark_text.frequency_vocabulary(["b a A", "c a b [PAD]"], 3)
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert vocab[5:] == ["a", "b", "[pad]"]  # counts a:3, b:2, then ties by name: [pad] < c


def test_every_stage_is_measured_and_printed(tmp_path, tf_text):
    from tasks import benchmark_text

    rows = "\n".join(f"sentence number {i} is {'good' if i % 2 else 'bad'}\t{i % 2}"
                     for i in range(40))
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + rows + "\n")
    figures = benchmark_text.measure(tmp_path, None, num_clients=4, sequence_length=8)
    out = benchmark_text.format_figures(figures, 4, "dirichlet", 8, None)
    assert "SST-2 train: 40 examples -> 4 clients (dirichlet)" in out
    for stage in ("load_tsv", "build_vocab", "tokenize", "partition", "client_data",
                  "first_batches", "total"):
        assert stage in out and figures[stage] >= 0
    assert figures["total"] == pytest.approx(
        sum(v for k, v in figures.items() if k not in ("total", "num_examples")), rel=1e-6)
