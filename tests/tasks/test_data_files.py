"""tasks/data_files.py: a user's CSV, TSV, JSON Lines and Alpaca JSON files written here, read
into rows, and every malformed input refused in one line naming the file, line and column."""

import json

import numpy as np
import pytest

from tasks import data_files
from tasks.data_files import TextColumns


def test_the_four_formats_give_the_same_rows(tmp_path):
    rows = [("a fine, long film", "it was \"great\"", "pos", "u1"),
            ("dull\tand slow", "meh", "neg", "u2"),
            ("ok", "fine", "10", "u1")]
    header = ("sentence", "sentence2", "y", "user")
    columns = TextColumns("sentence", "sentence2", "y", "user")
    (tmp_path / "d.csv").write_text(
        ",".join(header) + "\n" + "".join(
            ",".join('"' + v.replace('"', '""') + '"' for v in r) + "\n" for r in rows))
    (tmp_path / "d.tsv").write_text(
        "\t".join(header) + "\n" + "".join(
            "\t".join('"' + v.replace('"', '""') + '"' for v in r) + "\n" for r in rows))
    (tmp_path / "d.jsonl").write_text(
        "".join(json.dumps(dict(zip(header, r))) + "\n" for r in rows))
    (tmp_path / "d.json").write_text(json.dumps([dict(zip(header, r)) for r in rows], indent=1))
    for suffix in ("csv", "tsv", "jsonl", "json"):
        got = data_files.read_text_rows(tmp_path / f"d.{suffix}", columns)
        assert [t.tolist() for t in got.texts] == [[r[0] for r in rows], [r[1] for r in rows]]
        assert got.labels.tolist() == ["pos", "neg", "10"]
        assert got.clients.tolist() == ["u1", "u2", "u1"]
    # The JSON list's objects start on lines 2, 8 and 14 (indent=1: a brace, 4 keys, a brace).
    assert data_files.read_text_rows(tmp_path / "d.json", columns).lines.tolist() == [2, 8, 14]
    assert data_files.read_text_rows(tmp_path / "d.jsonl", columns).lines.tolist() == [1, 2, 3]


def test_labels_are_ordered_numerically_when_all_are_integers_else_alphabetically(tmp_path):
    path = tmp_path / "n.csv"
    path.write_text("text,label\na,10\nb,2\nc,1\nd,2\n")
    rows = data_files.read_text_rows(path, TextColumns())
    names = data_files.label_names(rows)
    assert names == ("1", "2", "10")
    np.testing.assert_array_equal(data_files.encoded_labels(rows, names), [2, 1, 0, 1])
    path.write_text("text,label\na,pos\nb,neg\nc,Neutral\n")
    assert data_files.label_names(data_files.read_text_rows(path, TextColumns())) == (
        "Neutral", "neg", "pos")


def test_a_quoted_csv_field_spanning_lines_keeps_the_line_it_starts_on(tmp_path):
    path = tmp_path / "q.csv"
    path.write_text('text,label\n"two\nlines",a\nthree,b\n')
    rows = data_files.read_text_rows(path, TextColumns())
    assert rows.texts[0].tolist() == ["two\nlines", "three"]
    assert rows.lines.tolist() == [2, 4]


@pytest.mark.parametrize("name, content, message", [
    ("missing.csv", "text,y\na,1\n",
     r"missing.csv: no column 'label' \(its columns: text, y\); name the label column with "
     r"label_column=<one of them>"),
    ("short.csv", "text,label\na,1\nb\n", r"short.csv: line 3: 1 field\(s\), the header has 2"),
    ("client.csv", "text,label,user\na,1,u\nb,0,\n",
     r"client.csv: line 3, column 'user': empty client"),
    ("label.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "label": ""}\n',
     r"label.jsonl: line 2, column 'label': empty label"),
    ("syntax.jsonl", '{"text": "a", "label": 1}\n{"text": "b" "label": 0}\n',
     r"syntax.jsonl: line 2, column 14: JSON syntax error: Expecting ',' delimiter"),
    ("syntax.json", '[\n {"text": "a", "label": 1},\n {"text": "b", "label": 0\n]\n',
     r"syntax.json: line 4, column 1: JSON syntax error: Expecting ',' delimiter"),
    ("notlist.json", '{"text": "a"}', r"notlist.json: expected a JSON list of objects, got a dict"),
    ("scalar.jsonl", '{"text": "a", "label": 1}\n3\n', r"scalar.jsonl: line 2: a JSON int, not"),
    ("empty.csv", "", r"empty.csv: empty file"),
    ("header.csv", "text,label\n", r"header.csv: no rows"),
    ("data.xlsx", "x", r"data.xlsx: unknown file type '.xlsx'; name it .csv, .tsv"),
])
def test_a_malformed_file_is_one_line_naming_file_line_and_column(tmp_path, name, content,
                                                                  message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as error:
        data_files.read_text_rows(path, TextColumns(client="user" if "client" in name else None))
    assert "\n" not in str(error.value)


def test_a_line_that_is_not_utf8_is_named_with_its_byte(tmp_path):
    path = tmp_path / "latin.csv"
    path.write_bytes("text,label\ngood,1\n".encode() + b"caf\xe9,0\n")
    with pytest.raises(ValueError, match=r"latin.csv: line 3: not UTF-8 \(byte 0xe9 at column "
                                         r"4\); save the file as UTF-8"):
        data_files.read_text_rows(path, TextColumns())


def test_a_missing_file_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.csv: no such file"):
        data_files.read_text_rows(tmp_path / "nope.csv", TextColumns())


def test_a_dev_label_training_never_saw_names_its_line_and_column(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\na,pos\nb,neg\n")
    (tmp_path / "dev.csv").write_text("text,label\nc,pos\nd,neutral\n")
    names = data_files.label_names(data_files.read_text_rows(tmp_path / "train.csv",
                                                             TextColumns()))
    dev = data_files.read_text_rows(tmp_path / "dev.csv", TextColumns())
    with pytest.raises(ValueError, match=r"dev.csv: line 3, column 'label': label 'neutral' does "
                                         r"not occur in the training rows \(their labels: neg, "
                                         r"pos\)"):
        data_files.encoded_labels(dev, names)


def test_alpaca_json_written_here_uses_both_templates(tmp_path):
    path = tmp_path / "data.json"
    path.write_text(json.dumps([
        {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
        {"instruction": "Name a colour.", "input": "", "output": "Blue"},
        {"instruction": "Say hi.", "output": "Hi"}]))
    got = data_files.read_instruction_rows(path).examples()
    assert got.prompts[0] == (
        "Below is an instruction that describes a task, paired with an input that provides "
        "further context. Write a response that appropriately completes the request.\n\n"
        "### Instruction:\nAdd the numbers.\n\n### Input:\n2 and 3\n\n### Response:")
    assert got.prompts[1] == (
        "Below is an instruction that describes a task. Write a response that appropriately "
        "completes the request.\n\n### Instruction:\nName a colour.\n\n### Response:")
    assert got.prompts[2].endswith("### Instruction:\nSay hi.\n\n### Response:")
    assert got.responses == ("5", "Blue", "Hi") and got.labels is None


def test_prompt_response_json_lines_with_clients(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text('{"prompt": "Q: 2+2?", "response": " 4", "user": "a"}\n\n'
                    '{"prompt": "Q: capital of France?", "response": " Paris", "user": "b"}\n')
    rows = data_files.read_instruction_rows(path, "user")
    assert rows.prompts == ("Q: 2+2?", "Q: capital of France?")
    assert rows.responses == (" 4", " Paris") and rows.clients.tolist() == ["a", "b"]
    assert rows.lines.tolist() == [1, 3]
    assert rows.subset([1]).responses == (" Paris",)


@pytest.mark.parametrize("content, message", [
    ('[{"instruction": "x", "input": ""}]',
     r"line 1: no output column 'output' \(its columns: instruction, input\)"),
    ('[{"instruction": "x", "output": "y"},\n 3]', r"line 2: a JSON int, not an object"),
    ('{"instruction": "x"}', r"expected a JSON list of objects, got a dict"),
    ("[{", r"line 1, column 3: JSON syntax error"),
    ('[{"question": "x", "answer": "y"}]',
     r"line 1: neither 'instruction' and 'output' \(Alpaca\) nor 'prompt' and 'response' \(its "
     r"keys: question, answer\)"),
    ('[{"prompt": "x", "response": "  "}]', r"line 1, column 'response': empty response"),
])
def test_a_malformed_instruction_file_is_one_line_naming_the_row(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        data_files.read_instruction_rows(path)
    with pytest.raises(FileNotFoundError, match="gone.json: no such file"):
        data_files.read_instruction_rows(tmp_path / "gone.json")


def test_prompts_to_generate_from_may_lack_their_responses(tmp_path):
    path = tmp_path / "ask.jsonl"
    path.write_text('{"instruction": "Add the numbers.", "input": "2 and 3"}\n'
                    '{"instruction": "Say hi.", "output": "Hi"}\n'
                    '{"prompt": "Q: 2+2?", "response": " "}\n')
    rows = data_files.read_instruction_rows(path, require_responses=False)
    assert rows.responses == ("", "Hi", "")
    assert rows.prompts[0].endswith("### Input:\n2 and 3\n\n### Response:")
    assert rows.prompts[2] == "Q: 2+2?"
    with pytest.raises(ValueError, match="ask.jsonl: line 1: no output column 'output'"):
        data_files.read_instruction_rows(path)


def test_the_form_of_an_instruction_files_rows(tmp_path):
    forms = {"alpaca.json": '[{"instruction": "x", "output": "y"}]',
             "chat.jsonl": '{"prompt": "x", "response": "y"}\n',
             "both.jsonl": '{"prompt": "x", "response": "y"}\n{"instruction": "x", "output": "y"}\n'}
    for name, content in forms.items():
        (tmp_path / name).write_text(content)
    assert [data_files.instruction_form(tmp_path / n) for n in forms] == [
        "alpaca", "as_written", "mixed"]
