"""Tests for tasks.text_files: TSV parsing (both quoting styles), real data counts, clear errors."""

import sys

import numpy as np
import pytest

from tasks import text_files


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_glue_layout_keeps_quote_characters(tmp_path):
    path = _write(tmp_path, "train.tsv",
                  'sentence\tlabel\n"quoted start\t1\nplain , text \t0\n\nit \'s "fine"\t1\n')
    ex = text_files.read_tsv(path)
    assert len(ex) == 3
    assert list(ex.segments[0]) == ['"quoted start', "plain , text ", 'it \'s "fine"']
    np.testing.assert_array_equal(ex.labels, [1, 0, 1])
    assert ex.labels.dtype == np.int32


def test_csv_quoting_allows_tabs_and_newlines(tmp_path):
    path = _write(tmp_path, "train.tsv",
                  'sentence\tlabel\n"Horrible.\n\tTwo lines, ""quoted"" word"\t0\nfine\t1\n')
    ex = text_files.read_tsv(path, quoting="csv")
    assert list(ex.segments[0]) == ['Horrible.\n\tTwo lines, "quoted" word', "fine"]
    np.testing.assert_array_equal(ex.labels, [0, 1])


def test_pairs_and_string_labels_in_glue_folder(tmp_path):
    _write(tmp_path, "train.tsv",
           "index\tquestion\tsentence\tlabel\n0\tWho?\tHe did.\tentailment\n"
           "1\tWhy?\tNo idea.\tnot_entailment\n")
    _write(tmp_path, "dev.tsv", "index\tquestion\tsentence\tlabel\n0\tQ\tS\tnot_entailment\n")
    data = text_files.load_glue_tsv(tmp_path, "qnli")
    assert sorted(data) == ["dev", "train"]
    train = data["train"]
    assert train.columns == ("question", "sentence")
    assert list(train.segments[0]) == ["Who?", "Why?"]
    assert list(train.segments[1]) == ["He did.", "No idea."]
    np.testing.assert_array_equal(train.labels, [0, 1])
    np.testing.assert_array_equal(data["dev"].labels, [1])


def test_missing_label_names_file_and_line(tmp_path):
    path = _write(tmp_path, "bad.tsv", "sentence\tlabel\ngood\t1\nno label here\n")
    with pytest.raises(ValueError, match=r"bad\.tsv:3: row has 1 field\(s\).*missing \['label'\]"):
        text_files.read_tsv(path)


def test_non_integer_label_names_value_and_line(tmp_path):
    path = _write(tmp_path, "bad.tsv", "sentence\tlabel\ngood\t1\nmeh\tpositive\n")
    with pytest.raises(ValueError, match=r"bad\.tsv:3: label 'positive' is not an integer"):
        text_files.read_tsv(path)


def test_empty_and_unknown_string_labels(tmp_path):
    path = _write(tmp_path, "bad.tsv", "sentence\tlabel\ngood\t\n")
    with pytest.raises(ValueError, match=r"bad\.tsv:2: empty label"):
        text_files.read_tsv(path)
    path = _write(tmp_path, "bad2.tsv", "sentence1\tsentence2\tlabel\na\tb\tmaybe\n")
    with pytest.raises(ValueError, match=r"bad2\.tsv:2: label 'maybe' is not one of"):
        text_files.read_tsv(path, ("sentence1", "sentence2"), label_names=("entailment",))


def test_missing_file_column_and_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.tsv"):
        text_files.read_tsv(tmp_path / "nope.tsv")
    path = _write(tmp_path, "x.tsv", "text\tlabel\na\t1\n")
    with pytest.raises(ValueError, match=r"x\.tsv: header \['text', 'label'\] lacks column"):
        text_files.read_tsv(path)
    with pytest.raises(FileNotFoundError, match="train.tsv"):
        text_files.load_glue_tsv(tmp_path, "sst2")
    with pytest.raises(FileNotFoundError, match="missing_dir"):
        text_files.load_glue_tsv(tmp_path / "missing_dir")
    with pytest.raises(ValueError, match="unknown GLUE task 'cola'"):
        text_files.load_glue_tsv(tmp_path, "cola")


def test_concatenate_and_subset():
    a = text_files.TextExamples((np.array(["x", "y"], object),), np.array([0, 1], np.int32))
    b = text_files.TextExamples((np.array(["z"], object),), np.array([1], np.int32))
    c = text_files.TextExamples.concatenate([a, b])
    assert list(c.segments[0]) == ["x", "y", "z"]
    sub = c.subset(np.array([2, 0]))
    assert list(sub.segments[0]) == ["z", "x"] and list(sub.labels) == [1, 0]


def test_real_sst2_counts(shared_data):
    data = text_files.load_glue_tsv(shared_data / "sst2", "sst2")
    assert {k: len(v) for k, v in data.items()} == {
        "train": 67349, "dev": 872, "test-labeled": 1821}
    train = data["train"]
    assert train.segments[0][0].strip() == "hide new secretions from the parental units"
    assert set(np.unique(train.labels)) == {0, 1}


def test_real_review_domains_counts_and_balance(shared_data):
    data = text_files.load_review_domains(shared_data / "multidomain_sentiment")
    assert sorted(data) == ["airline", "books", "dvd", "electronics", "kitchen"]
    for domain, splits in data.items():
        sizes = {s: len(e) for s, e in splits.items()}
        assert sizes == {"train": 1700, "dev": 300, "test-labeled": 2000}, domain
        for ex in splits.values():
            np.testing.assert_array_equal(np.bincount(ex.labels), [len(ex) // 2, len(ex) // 2])
    first = data["books"]["train"].segments[0][0]
    assert first.startswith("Horrible book, horrible.\n") and "\n" in first


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
