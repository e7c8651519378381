"""runner/generation.py's prompts: what the model reads for each way a run was prompted
(the templates written out here), prompts files, and the one-line refusals. The generation itself
(a trained run, a PEFT folder) is tested through scripts/generate.py in
tests/scripts/test_generate.py."""

import json

import pytest

from runner import generation

ALPACA_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\nAdd the numbers.\n\n### Input:\n2 and 3\n\n### Response:")
ALPACA_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n### Instruction:\nName a colour.\n\n### Response:")


def test_bare_prompts_take_the_runs_template():
    prompts = generation.Prompts(("Add the numbers.", "Name a colour."), inputs=("2 and 3", ""))
    assert generation.model_prompts(prompts, "alpaca") == [ALPACA_WITH_INPUT, ALPACA_NO_INPUT]
    review = generation.Prompts(("a gorgeous movie.",))
    assert generation.model_prompts(review, "sentiment") == [
        "Review: a gorgeous movie.\nSentiment:"]
    assert generation.model_prompts(review, "as_written") == ["a gorgeous movie."]
    raw = generation.Prompts(("a gorgeous movie.",), as_written=True)
    assert generation.model_prompts(raw, "sentiment") == ["a gorgeous movie."]


@pytest.mark.parametrize("make, message", [
    (lambda: generation.Prompts(()), "no prompts: give at least one"),
    (lambda: generation.Prompts(("a", "\t")), "prompt 2 is empty"),
    (lambda: generation.Prompts(("a", "b"), inputs=("x",)),
     '1 inputs for 2 prompts: give one per prompt \\("" for none\\)'),
    (lambda: generation.Prompts(("a",), inputs=("x",), as_written=True),
     "inputs go into Alpaca's template; prompts as written have none"),
    (lambda: generation.model_prompts(generation.Prompts(("a", "b"), inputs=("", "x")),
                                      "sentiment"),
     "prompt 2: input 'x': an input is part of Alpaca's prompts; sentiment prompts have none"),
    (lambda: generation.model_prompts(generation.Prompts(("a",)), "mixed"),
     "mix Alpaca's form and prompt/response rows"),
    (lambda: generation.GenerationOptions(max_new_tokens=0), "max_new_tokens=0: must be >= 1"),
])
def test_prompts_that_cannot_work_are_one_line(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_prompts_file_of_lines_or_of_rows(tmp_path):
    (tmp_path / "ask.txt").write_text("Add the numbers.\n\n  \nName a colour.\n")
    lines = generation.read_prompts(tmp_path / "ask.txt")
    assert lines.texts == ("Add the numbers.", "Name a colour.") and not lines.as_written
    (tmp_path / "ask.json").write_text(json.dumps([
        {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
        {"instruction": "Name a colour."}]))
    rows = generation.read_prompts(tmp_path / "ask.json")
    assert rows.texts == (ALPACA_WITH_INPUT, ALPACA_NO_INPUT) and rows.as_written
    assert rows.references == ("5", "")
    assert generation.model_prompts(rows, "sentiment") == [ALPACA_WITH_INPUT, ALPACA_NO_INPUT]
    (tmp_path / "empty.txt").write_text("\n \n")
    with pytest.raises(ValueError, match="empty.txt: no prompts"):
        generation.read_prompts(tmp_path / "empty.txt")
    with pytest.raises(ValueError, match="gone.txt: no such file"):
        generation.read_prompts(tmp_path / "gone.txt")


def test_results_are_written_as_json_lines(tmp_path):
    results = generation.Generations("a run", "alpaca", (
        generation.Generation("p1", " 5", "5"), generation.Generation("p2", "caf\u00e9")))
    generation.write_json_lines(results, tmp_path / "out.jsonl")
    lines = (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [
        {"prompt": "p1", "continuation": " 5", "reference": "5"},
        {"prompt": "p2", "continuation": "caf\u00e9"}]
