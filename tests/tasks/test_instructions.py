"""tasks/instructions.py: sentiment data as instructions and the packed prompt/response/padding
layout (Alpaca files: tests/tasks/test_data_files.py)."""

import numpy as np
import pytest

from tasks import instructions
from tasks.text_files import TextExamples


def _chars(text):
    return [ord(c) for c in text]


def test_sentiment_examples_become_review_prompts_with_their_labels():
    examples = TextExamples((np.array(["great acting", "a bore"], dtype=object),),
                            np.array([1, 0], np.int32), ("sentence",))
    got = instructions.from_sentiment(examples)
    assert got.prompts == ("Review: great acting\nSentiment:", "Review: a bore\nSentiment:")
    assert got.responses == (" positive", " negative")
    np.testing.assert_array_equal(got.labels, [1, 0])
    assert got.subset([1]).responses == (" negative",)
    with pytest.raises(ValueError, match="label 2 of example 1 is not 0 or 1"):
        instructions.from_texts(["a", "b"], [0, 2])


def test_pack_lays_out_prompt_response_padding_and_cuts_the_prompt_start():
    examples = instructions.InstructionExamples(("abc", "abcdefgh"), ("xy", "z"))
    batch = instructions.pack(examples, _chars, sequence_length=6, end_id=1)
    # Row 0: "abc" + "xy" + end fits exactly; row 1: "abcdefgh" loses "abcd" for "z" + end.
    assert batch["token_ids"].tolist() == [[97, 98, 99, 120, 121, 1], [101, 102, 103, 104, 122, 1]]
    assert batch["response_mask"].tolist() == [[0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1]]
    assert batch["padding_mask"].tolist() == [[1] * 6, [1] * 6]
    short = instructions.pack(instructions.InstructionExamples(("ab",), ("c",)), _chars, 5)
    assert short["token_ids"].tolist() == [[97, 98, 99, 0, 0]]
    assert short["padding_mask"].tolist() == [[1, 1, 1, 0, 0]]
    assert short["response_mask"].tolist() == [[0, 0, 1, 0, 0]]


def test_pack_keeps_one_prompt_token_when_the_response_is_too_long():
    batch = instructions.pack(instructions.InstructionExamples(("ab",), ("wxyz",)), _chars, 3)
    assert batch["token_ids"].tolist() == [[98, 119, 120]]
    assert batch["response_mask"].tolist() == [[0, 1, 1]]
    with pytest.raises(ValueError, match="sequence_length=1: must be >= 2"):
        instructions.pack(instructions.InstructionExamples(("a",), ("b",)), _chars, 1)


def test_hand_written_generations_are_parsed_and_unparseable_ones_count_as_wrong():
    generations = [" positive", "Negative.", " positive\nReview: next", "I think it is positive",
                   "", "NEGATIVE!", " neutral"]
    labels = [1, 0, 0, 1, 0, 0, 1]
    assert [instructions.parse_sentiment(g) for g in generations] == [1, 0, 1, None, None, 0, None]
    assert instructions.exact_match_accuracy(generations, labels) == {
        "accuracy": 3 / 7, "unparseable": 3 / 7}
    with pytest.raises(ValueError, match="2 generations for 1 labels"):
        instructions.exact_match_accuracy(["a", "b"], [1])


def test_dirichlet_clients_get_their_own_packed_examples_with_response_targets():
    from tasks import partition_schemes

    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(["good", "bad", "plot", "film"], 3)) for _ in range(40)]
    labels = rng.integers(0, 2, 40)
    examples = instructions.from_texts(texts, labels)
    parts = partition_schemes.dirichlet(examples.labels, num_clients=3, alpha=0.5, seed=0)
    datasets = instructions.client_datasets(examples, parts, _chars, sequence_length=48,
                                            batch_size=4)
    assert sorted(datasets) == sorted(parts)
    for cid, idx in parts.items():
        xs, ys = zip(*[(x, y.numpy()) for x, y in datasets[cid]])
        tokens = np.concatenate([x["token_ids"].numpy() for x in xs])
        assert len(tokens) == len(idx)
        # Each example's targets are its answer's characters, in order (row-major per batch).
        expected = np.concatenate([_chars(instructions.SENTIMENT_ANSWERS[labels[i]])
                                   for i in idx])
        np.testing.assert_array_equal(np.concatenate(ys), expected)
        for row, i in zip(tokens, idx):
            prompt = _chars(examples.prompts[i])
            assert row[:len(prompt)].tolist() == prompt


def test_pack_puts_the_start_token_first_and_keeps_it_when_the_prompt_is_cut():
    examples = instructions.InstructionExamples(("abcdefgh",), ("z",))
    batch = instructions.pack(examples, _chars, sequence_length=6, end_id=1, start_id=2)
    # start + the prompt's last 3 characters + "z" + end.
    assert batch["token_ids"].tolist() == [[2, 102, 103, 104, 122, 1]]
    assert batch["response_mask"].tolist() == [[0, 0, 0, 0, 1, 1]]


def test_a_bare_prompt_in_each_style_is_its_training_rows_prompt():
    """The templates written out here (Stanford Alpaca's train.py, the sentiment tasks')."""
    assert instructions.styled_prompt("sentiment", "dull") == "Review: dull\nSentiment:"
    assert instructions.styled_prompt("alpaca", "Add the numbers.", "2 and 3") == (
        "Below is an instruction that describes a task, paired with an input that provides "
        "further context. Write a response that appropriately completes the request.\n\n"
        "### Instruction:\nAdd the numbers.\n\n### Input:\n2 and 3\n\n### Response:")
    no_input = ("Below is an instruction that describes a task. Write a response that "
                "appropriately completes the request.\n\n### Instruction:\nName a colour.\n\n"
                "### Response:")
    for blank in (None, "", "  "):
        assert instructions.styled_prompt("alpaca", "Name a colour.", blank) == no_input
    assert instructions.styled_prompt("as_written", "Q: 2+2?") == "Q: 2+2?"
    with pytest.raises(ValueError, match="an input is part of Alpaca's prompts; sentiment"):
        instructions.styled_prompt("sentiment", "dull", "more")
    with pytest.raises(ValueError, match="prompt style 'chat': choose one of sentiment, alpaca"):
        instructions.styled_prompt("chat", "hi")
