"""The instruction-tuning tasks' `RunTask`s: SST-2 or the review domains as prompt → answer pairs
for a decoder language model with LoRA (issue 54, items 2-4).

`build_task("sst2_instruct" | "reviews_instruct", backbone=<a models.decoders name>, ...)`
becomes `_instruct_run_task`. Every example is `tasks.instructions.SENTIMENT_PROMPT` ("Review:
<text>\\nSentiment:") after a begin-of-text token, answered by " negative" or " positive" and the
end-of-text token. The tokenized prompts are stored with their labels, so the label partitions
(IID, Dirichlet, shards) and the review domains' natural clients cut them exactly as they cut the
classifier's data (`tasks.task`); each batch gets its answers appended in the graph
(`AnswerAppender`): `response_mask` covers the answer tokens only, and the batch is cut to its
longest row. The model is `models.causal_lm.build_causal_lm` on the decoder with LoRA: logits
(n, V) at the n response positions, y the n answer tokens (`with_response_targets`), so the
engine's loss is the response-only next-token cross-entropy and its "examples" are tokens.

Evaluation on the dev (SST-2) or test (reviews) split, every `evaluate`:
- `loss`, `token_accuracy`: the answer tokens' mean cross-entropy and next-token accuracy;
- `accuracy`: greedy generation (up to the longest answer's tokens, stopping at end of text),
  parsed by its first word (`instructions.parse_sentiment`), unparseable counted wrong (the
  RoLoRA paper's protocol); `unparseable`: the share that named neither class;
- `likelihood_accuracy`: the answer of higher log-likelihood p(answer | prompt) is the choice.
"""

from __future__ import annotations

import collections
import pathlib
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from tasks import instructions
from tasks.run_task import RunTask, _ordered, _train_size, counted, starting_values
from tffl.simulation import evaluation
from tffl.simulation.metrics_log import announce

INSTRUCT_TASKS = ("sst2_instruct", "reviews_instruct")
_PROMPT_HEAD, _PROMPT_TAIL = instructions.SENTIMENT_PROMPT.split("{text}")


class PromptPacker:
    """`(texts (b,),) -> {"token_ids", "padding_mask"}` int32 (b, w): begin of text, then the
    prompt's tokens (its last `max_prompt` only, when given: the "Sentiment:" cue stays), then
    `pad_id`, w the batch's longest prompt. A `tasks.text.tokenize` preprocessor."""

    def __init__(self, tokenizer, bos_id: int, pad_id: int, max_prompt: int | None = None):
        self.tokenizer, self.bos_id, self.pad_id = tokenizer, bos_id, pad_id
        self.max_prompt = max_prompt

    def __call__(self, segments: tuple) -> dict:
        prompts = tf.strings.join([_PROMPT_HEAD, segments[0], _PROMPT_TAIL])
        ids = tf.cast(self.tokenizer(prompts), tf.int32)
        bos = tf.fill([tf.shape(prompts)[0], 1], tf.constant(self.bos_id, tf.int32))
        ids = tf.concat([tf.RaggedTensor.from_tensor(bos), ids], axis=1)
        if self.max_prompt is not None:
            ids = ids[:, -self.max_prompt:]
        token_ids = ids.to_tensor(default_value=self.pad_id)
        padding_mask = tf.sequence_mask(ids.row_lengths(), tf.shape(token_ids)[1],
                                        dtype=tf.int32)
        return {"token_ids": token_ids, "padding_mask": padding_mask}


class AnswerAppender:
    """`(x, labels) -> (x', y)` on a batch of packed prompts: the rows widened by the longest
    answer, answer `answers[label]` written after each prompt, `response_mask` on it, the batch
    cut to its longest row, and y its answer tokens (`models.causal_lm.with_response_targets`).
    """

    def __init__(self, answers: Sequence[Sequence[int]], pad_id: int):
        width = max(len(a) for a in answers)
        self.pad_id = pad_id
        self.table = tf.constant([list(a) + [pad_id] * (width - len(a)) for a in answers],
                                 tf.int32)
        self.lengths = tf.constant([len(a) for a in answers], tf.int32)
        self.width = width

    def __call__(self, x, labels):
        from models import causal_lm

        widen = [[0, 0], [0, self.width]]
        token_ids = tf.pad(tf.convert_to_tensor(x["token_ids"]), widen,
                           constant_values=self.pad_id)
        prompt_mask = tf.pad(tf.cast(x["padding_mask"], tf.int32), widen)
        prompt_lengths = tf.reduce_sum(prompt_mask, axis=1)
        labels = tf.cast(labels, tf.int32)
        answer_lengths = tf.gather(self.lengths, labels)
        offset = tf.range(tf.shape(token_ids)[1])[None, :] - prompt_lengths[:, None]
        in_answer = (offset >= 0) & (offset < answer_lengths[:, None])
        tokens = tf.gather(tf.gather(self.table, labels),
                           tf.clip_by_value(offset, 0, self.width - 1), batch_dims=1)
        width = tf.reduce_max(prompt_lengths + answer_lengths)
        batch = collections.OrderedDict(
            padding_mask=tf.cast(tf.cast(prompt_mask, tf.bool) | in_answer, tf.int32)[:, :width],
            response_mask=tf.cast(in_answer, tf.int32)[:, :width],
            token_ids=tf.where(in_answer, tokens, token_ids)[:, :width])
        return causal_lm.with_response_targets(batch)


def _answers(decoder) -> list[list[int]]:
    """The token ids of each class's answer (`instructions.SENTIMENT_ANSWERS`) and end of text."""
    return [ids + [decoder.eos_id] for ids in decoder.tokenize(instructions.SENTIMENT_ANSWERS)]


def _check_lengths(sequence_length: int | None, decoder, answer_width: int) -> int:
    """The most prompt tokens a row keeps: `sequence_length` (None: the decoder's positions)
    less the longest answer; a length with no room for the answer, or above the decoder's
    positions, is refused."""
    if sequence_length is None:
        return decoder.max_length - answer_width
    if sequence_length > decoder.max_length:
        raise ValueError(f"sequence_length={sequence_length}: {decoder.name} has "
                         f"{decoder.max_length} positions; pass at most that")
    if sequence_length < answer_width + 1:
        raise ValueError(f"sequence_length={sequence_length}: the answers take up to "
                         f"{answer_width} tokens and the prompt at least one; pass at least "
                         f"{answer_width + 1}")
    return sequence_length - answer_width


def _lm_builder(decoder, lora_config) -> Callable[[], tuple]:
    """`() -> (backbone, causal LM)`: the decoder with LoRA (`lora_config`) and the response
    logits on top, freshly built (random backbone weights)."""
    from models import causal_lm
    from models import lora_targets as targets_lib

    def build():
        backbone = decoder.backbone_fn()
        targets_lib.apply_lora(backbone, lora_config)
        return backbone, causal_lm.build_causal_lm(backbone)

    return build


def _check_targets(decoder, lora_config) -> None:
    """`lora_targets=...` in one line when the decoder's layers lack a target (before any data
    is read)."""
    missing = [t for t in lora_config.targets if t not in decoder.lora_targets]
    if missing:
        raise ValueError(f"lora_targets={','.join(lora_config.targets)}: {decoder.name}'s "
                         f"decoder layers have no {missing[0]!r} projection; its targets are "
                         f"{', '.join(decoder.lora_targets)}")


def _dev_prompts(task) -> tuple[list[list[int]], np.ndarray]:
    """The evaluated split's prompts (token lists, begin of text first) and labels."""
    x, y = zip(*task.global_test_data.batch(4096).as_numpy_iterator())
    token_ids = np.concatenate([b["token_ids"] for b in x])
    lengths = np.concatenate([b["padding_mask"] for b in x]).sum(1)
    return [list(map(int, row[:n])) for row, n in zip(token_ids, lengths)], np.concatenate(y)


def make_evaluator(lm_fn: Callable[[], tuple], task, decoder, answers, batch_size: int = 32):
    """`weights -> {"loss", "token_accuracy", "accuracy", "unparseable",
    "likelihood_accuracy"}` on `task`'s evaluated split (module docstring), one model built on
    first call (after TFF has traced its computations)."""
    from models import lm_evaluation

    appender = AnswerAppender(answers, decoder.pad_id)
    cache = {}

    def model_fn():   # the answer-token model; its backbone generates and scores answers
        cache["backbone"], model = lm_fn()
        cache["prompts"] = _dev_prompts(task)
        return model

    # One graph per batch: a dataset loop inside one tf.function ran its body eagerly here
    # (Gemma 3's evaluation took minutes longer).
    answer_tokens = evaluation.make_keras_evaluator(
        model_fn, lambda: task.global_test_data.batch(batch_size).map(appender),
        graph_per_batch=True)

    def evaluate(weights) -> dict[str, float]:
        tokens = answer_tokens(weights)   # assigns `weights` to the model (and its backbone)
        backbone, (prompts, labels) = cache["backbone"], cache["prompts"]
        generated = lm_evaluation.generate(
            backbone, prompts, max(len(a) for a in answers) - 1, stop_ids=[decoder.eos_id],
            pad_id=decoder.pad_id, batch_size=batch_size)
        matched = instructions.exact_match_accuracy(
            [decoder.detokenize(g) for g in generated], labels)
        chosen = lm_evaluation.choose(backbone, prompts, [a[:-1] for a in answers],
                                      pad_id=decoder.pad_id, batch_size=batch_size)
        return {"loss": tokens["loss"], "token_accuracy": tokens["accuracy"],
                "accuracy": matched["accuracy"], "unparseable": matched["unparseable"],
                "likelihood_accuracy": float(np.mean(chosen == labels))}

    return evaluate


def _starting_values(lm_fn, decoder, lora_config, input_spec) -> Callable[[], tuple]:
    """`() -> (trainable, non_trainable)` starting weights, drawn once: the LoRA factors' draw,
    with the checkpoint's backbone for a pretrained decoder."""

    def pretrained():
        from models import causal_lm
        from models import lora_targets as targets_lib

        backbone = decoder.pretrained_fn()
        targets_lib.apply_lora(backbone, lora_config)
        return [v.numpy() for v in causal_lm.build_causal_lm(backbone).non_trainable_variables]

    return starting_values(lambda: lm_fn()[1], input_spec,
                           pretrained if decoder.pretrained_fn is not None else None,
                           decoder.name)


def _instruct_run_task(name: str, num_clients: int, batch_size: int, local_steps: int,
                       seed: int, partition: str, data_dir, backbone: str, rank: int,
                       lora_alpha, lora_targets: tuple[str, ...], lora_layers,
                       sequence_length: int | None, scheme_kwargs: dict,
                       bucket_by_length: bool = True) -> RunTask:
    """SST-2 (partitioned) or the five review domains (natural clients) as instructions for the
    decoder `backbone` (`models.decoders`) with LoRA on `lora_targets` of `lora_layers`.
    A row's prompt keeps its last `sequence_length` − (answer tokens) tokens; `sequence_length`
    None is the decoder's positions (every SST-2 sentence whole), and each batch is cut to its
    longest row. With
    `bucket_by_length`, a round's examples are batched with neighbours in length
    (`tasks.batching`), else in drawn order; each batch is cut to its longest row."""
    from models import decoders
    from models import lora_targets as targets_lib
    from tasks import prefix_cache as prefix_lib
    from tasks import text_run_task

    if data_dir is None and name == "reviews_instruct":
        raise ValueError("data_dir is needed: task 'reviews_instruct' reads the five review "
                         "domains from a folder; pass data_dir=<folder with "
                         "multidomain_sentiment/>, e.g. ../shared/data")
    if backbone not in decoders.DECODERS:
        raise ValueError(f"backbone={backbone}: task {name!r} trains a decoder language model; "
                         f"choose one of {', '.join(decoders.DECODERS)}")
    lora_config = targets_lib.LoraConfig(rank=rank, alpha=lora_alpha, targets=lora_targets,
                                         layers=lora_layers, seed=seed)
    announce(f"building the {backbone} decoder and its tokenizer")
    decoder = decoders.build_decoder(backbone)
    _check_targets(decoder, lora_config)
    answers = _answers(decoder)
    answer_width = max(len(a) for a in answers)
    packer = PromptPacker(decoder.tokenizer, decoder.bos_id, decoder.pad_id,
                          _check_lengths(sequence_length, decoder, answer_width))
    data_dir = None if data_dir is None else pathlib.Path(data_dir)
    # The classifier's loader, on the same data and partitions (`tasks.text_run_task`).
    task = text_run_task._load_text_task(name.removesuffix("_instruct"), num_clients, seed,
                                         partition, data_dir, scheme_kwargs, packer)
    lm_fn = _lm_builder(decoder, lora_config)
    input_spec = (collections.OrderedDict(
        (k, tf.TensorSpec([None, None], tf.int32))
        for k in ("padding_mask", "response_mask", "token_ids")), tf.TensorSpec([None], tf.int32))
    appender = AnswerAppender(answers, decoder.pad_id)
    rounds = prefix_lib.TextRounds(
        lambda cid: prefix_lib.ClientExamples.from_dataset(
            task.train_data.create_tf_dataset_for_client(cid).map(_ordered)),
        local_steps, batch_size, seed, bucket_by_length=bucket_by_length, cache=None,
        client_ids=task.train_data.client_ids, name="train")
    run = RunTask(
        description=(f"{name} ({_train_size(task)} train examples, "
                     f"{counted(len(task.train_data.client_ids), 'client')}; {decoder.description}"
                     f", LoRA r={rank} on {','.join(lora_targets)}, answers "
                     f"{'/'.join(repr(a) for a in instructions.SENTIMENT_ANSWERS)}, "
                     f"L={sequence_length or f'up to {decoder.max_length} tokens'}; "
                     f"{'batches bucketed by length' if bucket_by_length else 'drawn order'}, "
                     "no prefix cache)"),
        client_ids=list(task.train_data.client_ids),
        client_dataset_fn=lambda cid, round_num: rounds.dataset(cid, round_num).map(appender),
        keras_model_fn=lambda: lm_fn()[1],
        input_spec=input_spec,
        evaluate=make_evaluator(lm_fn, task, decoder, answers),
    )
    values = _starting_values(lm_fn, decoder, lora_config, input_spec)
    run.pretrained_non_trainable = (lambda: values()[1]) if decoder.pretrained_fn else None
    return run
