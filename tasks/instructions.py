"""Instruction-tuning data: prompt/response pairs from our labelled text (and the templates of
Alpaca-style files, which `tasks.data_files` reads), packed into the batches of
`models.causal_lm`.

- `from_sentiment(examples)`: SST-2 or a review domain (`tasks.text_files.TextExamples`, labels
  0/1) as `"Review: <text>\\nSentiment:"` → `" negative"` / `" positive"`. The labels are kept, so
  `tasks.partition`'s IID and Dirichlet splits apply as to the classifier's data, and the review
  domains stay natural clients.
- `ALPACA_PROMPT`, `ALPACA_PROMPT_NO_INPUT`: Stanford Alpaca's two templates; `alpaca_prompt`
  picks one and fills it, as `tasks.data_files.read_instruction_rows` prompts
  `{"instruction", "input", "output"}` rows.
- `styled_prompt(style, text)`: a bare prompt as a run's training rows were prompted
  (`PROMPT_STYLES`: the sentiment template, Alpaca's, or as written), to generate from the
  trained model as it was trained.
- `pack(examples, tokenize, sequence_length)`: `token_ids`, `padding_mask` and `response_mask`
  (int32, (n, T)): (a start token,) prompt, then response, then right padding; a prompt too long
  loses its start, so that the response (cut at T − 1 tokens) is kept.
- `client_datasets(examples, parts, tokenize, sequence_length, batch_size)`: each client's
  batches `(x, y)` for the LoRA algorithms (`models.causal_lm.with_response_targets`), the
  clients cut by any `tasks.partition` scheme (IID, Dirichlet on the kept labels, by domain).
- `parse_sentiment(generation)` and `exact_match_accuracy`: the RoLoRA paper's protocol for
  generated answers: the first word names the class, and an unparseable answer counts as wrong.

Example:

>>> examples = from_texts(["a fine film", "dull"], [1, 0])
>>> examples.prompts[0], examples.responses[0]
('Review: a fine film\\nSentiment:', ' positive')
>>> batch = pack(examples, lambda s: [ord(c) % 50 + 1 for c in s], sequence_length=32)
>>> batch["response_mask"][1].sum(), batch["padding_mask"][1].sum()   # " negative": 9 of 32
(9, 32)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

SENTIMENT_PROMPT = "Review: {text}\nSentiment:"
SENTIMENT_ANSWERS = (" negative", " positive")
# Stanford Alpaca's templates (github.com/tatsu-lab/stanford_alpaca, train.py PROMPT_DICT).
ALPACA_PROMPT = (
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:")
ALPACA_PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:")
# How a run's training rows were prompted: SENTIMENT_PROMPT (sst2_instruct, reviews_instruct),
# Alpaca's templates (Alpaca rows), or the prompt as written (prompt/response rows).
PROMPT_STYLES = ("sentiment", "alpaca", "as_written")


@dataclasses.dataclass(frozen=True)
class InstructionExamples:
    """n prompt/response pairs; `labels` (int32 (n,), or None) for label-based client splits."""

    prompts: tuple[str, ...]
    responses: tuple[str, ...]
    labels: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.prompts)

    def subset(self, idx) -> "InstructionExamples":
        """The examples at indices `idx`."""
        idx = np.asarray(idx, dtype=np.int64)
        return InstructionExamples(tuple(self.prompts[i] for i in idx),
                                   tuple(self.responses[i] for i in idx),
                                   None if self.labels is None else self.labels[idx])


def alpaca_prompt(instruction: str, input_text: str | None = None) -> str:
    """Stanford Alpaca's prompt of an instruction: `ALPACA_PROMPT` with its input, or
    `ALPACA_PROMPT_NO_INPUT` when the input is None or blank.

    >>> alpaca_prompt("Add the numbers.", "2 and 3").endswith(
    ...     "### Instruction:\\nAdd the numbers.\\n\\n### Input:\\n2 and 3\\n\\n### Response:")
    True
    >>> alpaca_prompt("Name a color.", " ") == ALPACA_PROMPT_NO_INPUT.format(
    ...     instruction="Name a color.")
    True
    """
    if input_text is not None and input_text.strip():
        return ALPACA_PROMPT.format(instruction=instruction, input=input_text)
    return ALPACA_PROMPT_NO_INPUT.format(instruction=instruction)


def styled_prompt(style: str, text: str, input_text: str | None = None) -> str:
    """`text` prompted in `style` (one of `PROMPT_STYLES`): "sentiment" is `SENTIMENT_PROMPT`
    around a review, "alpaca" `alpaca_prompt(text, input_text)`, "as_written" `text` itself.
    An input (non-blank `input_text`) is Alpaca's alone: for another style, a `ValueError`.

    >>> styled_prompt("sentiment", "a fine film")
    'Review: a fine film\\nSentiment:'
    >>> styled_prompt("as_written", "2 + 3 =")
    '2 + 3 ='
    """
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt style {style!r}: choose one of {', '.join(PROMPT_STYLES)}")
    if style == "alpaca":
        return alpaca_prompt(text, input_text)
    if input_text is not None and input_text.strip():
        raise ValueError(f"input {input_text!r}: an input is part of Alpaca's prompts; "
                         f"{style} prompts have none")
    return SENTIMENT_PROMPT.format(text=text) if style == "sentiment" else text


def from_texts(texts: Sequence[str], labels: Sequence[int]) -> InstructionExamples:
    """Sentiment texts (labels 0 negative, 1 positive) as instructions."""
    labels = np.asarray(labels, dtype=np.int32)
    if len(texts) != len(labels):
        raise ValueError(f"{len(texts)} texts but {len(labels)} labels")
    bad = np.flatnonzero((labels < 0) | (labels >= len(SENTIMENT_ANSWERS)))
    if bad.size:
        raise ValueError(f"label {labels[bad[0]]} of example {bad[0]} is not 0 or 1 (sentiment)")
    return InstructionExamples(tuple(SENTIMENT_PROMPT.format(text=t) for t in texts),
                               tuple(SENTIMENT_ANSWERS[y] for y in labels), labels)


def from_sentiment(examples) -> InstructionExamples:
    """`tasks.text_files.TextExamples` of one segment (SST-2, a review domain) as instructions."""
    if len(examples.segments) != 1:
        raise ValueError(f"sentiment instructions take one text segment, got "
                         f"{len(examples.segments)}")
    return from_texts([str(t) for t in examples.segments[0]], examples.labels)


def pack(examples: InstructionExamples, tokenize: Callable[[str], Sequence[int]],
         sequence_length: int, pad_id: int = 0, end_id: int | None = None,
         start_id: int | None = None) -> dict[str, np.ndarray]:
    """`{"token_ids", "padding_mask", "response_mask"}`, int32 (n, sequence_length): each row is
    `start_id` (if given), its prompt's tokens, then its response's (`end_id` appended if given),
    then `pad_id`. The response keeps at most `sequence_length − 1` tokens (one prompt token must
    predict its first); the prompt loses tokens from its start (after `start_id`) to make room."""
    if sequence_length < 2 + (start_id is not None):
        raise ValueError(f"sequence_length={sequence_length}: must be >= "
                         f"{2 + (start_id is not None)} (a prompt token and a response token)")
    n = len(examples)
    start = [] if start_id is None else [start_id]
    token_ids = np.full((n, sequence_length), pad_id, np.int32)
    padding_mask = np.zeros((n, sequence_length), np.int32)
    response_mask = np.zeros((n, sequence_length), np.int32)
    for i, (prompt, response) in enumerate(zip(examples.prompts, examples.responses)):
        answer = list(tokenize(response)) + ([end_id] if end_id is not None else [])
        answer = answer[:sequence_length - 1 - len(start)]
        question = list(tokenize(prompt))[-(sequence_length - len(start) - len(answer)):]
        if not question:
            raise ValueError(f"example {i}: its prompt has no tokens")
        row = start + question + answer
        token_ids[i, :len(row)] = row
        padding_mask[i, :len(row)] = 1
        response_mask[i, len(row) - len(answer):len(row)] = 1
    return {"token_ids": token_ids, "padding_mask": padding_mask, "response_mask": response_mask}


def client_datasets(examples: InstructionExamples, parts, tokenize: Callable[[str], Sequence[int]],
                    sequence_length: int, batch_size: int, **pack_kwargs) -> dict:
    """`{client id: tf.data.Dataset}` of `(x, y)` batches: client `cid` holds the examples at
    `parts[cid]` (a `tasks.partition` partition), packed (`pack`) in that order, batched, and
    mapped by `models.causal_lm.with_response_targets` (y: the batch's response tokens)."""
    import collections

    import tensorflow as tf

    from models import causal_lm

    packed = pack(examples, tokenize, sequence_length, **pack_kwargs)
    datasets = {}
    for cid, idx in parts.items():
        x = collections.OrderedDict((k, packed[k][np.asarray(idx)]) for k in sorted(packed))
        datasets[cid] = (tf.data.Dataset.from_tensor_slices(x).batch(batch_size)
                         .map(causal_lm.with_response_targets))
    return datasets


def parse_sentiment(generation: str) -> int | None:
    """1 for a generation whose first word is "positive", 0 for "negative" (any case, trailing
    punctuation ignored), None otherwise.

    >>> [parse_sentiment(g) for g in (" Positive.", "negative\\nReview: ...", "meh")]
    [1, 0, None]
    """
    words = generation.split()
    if not words:
        return None
    word = words[0].strip(".,;:!?\"'").lower()
    return {answer.strip(): label for label, answer in enumerate(SENTIMENT_ANSWERS)}.get(word)


def exact_match_accuracy(generations: Sequence[str], labels: Sequence[int],
                         parse: Callable[[str], int | None] = parse_sentiment) -> dict[str, float]:
    """`{"accuracy", "unparseable"}`: the fraction of generations whose parsed answer equals the
    label (an unparseable one is wrong), and the fraction that could not be parsed."""
    if len(generations) != len(labels) or not len(labels):
        raise ValueError(f"{len(generations)} generations for {len(labels)} labels")
    parsed = [parse(g) for g in generations]
    correct = sum(p is not None and p == int(y) for p, y in zip(parsed, labels))
    return {"accuracy": correct / len(labels),
            "unparseable": sum(p is None for p in parsed) / len(labels)}
