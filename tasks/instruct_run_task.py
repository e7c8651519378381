"""The instruction-tuning tasks' `RunTask`s: prompt → response pairs for a decoder language model
with LoRA, from SST-2 or the review domains as sentiment prompts, or from the user's own
instruction files.

`instruct_run_task(spec)` is what `tasks.registry.build_run_task` makes of a `TaskSpec` whose task is
"sst2_instruct", "reviews_instruct" or "instruct".

**Sentiment prompts** (`sst2_instruct`, `reviews_instruct`). Every example is
`tasks.instructions.SENTIMENT_PROMPT` ("Review: <text>\\nSentiment:") after a begin-of-text token,
answered by " negative" or " positive" and the end-of-text token. The tokenized prompts are stored
with their labels, so the label partitions (IID, Dirichlet, shards) and the review domains'
natural clients cut them exactly as they cut the classifier's data (`tasks.task`); each batch gets
its answers appended in the graph (`AnswerAppender`): `response_mask` covers the answer tokens
only, and the batch is cut to its longest row. Evaluation on the dev (SST-2) or test (reviews)
split, every `evaluate` (with `eval_test`, sst2_instruct also on SST-2's labeled test split,
the same measures named `test_<measure>`):
- `loss`, `token_accuracy`: the answer tokens' mean cross-entropy and next-token accuracy;
- `accuracy`: greedy generation (up to the longest answer's tokens, stopping at end of text),
  parsed by its first word (`instructions.parse_sentiment`), unparseable counted wrong (the
  RoLoRA paper's protocol); `unparseable`: the share that named neither class;
- `likelihood_accuracy`: the answer of higher log-likelihood p(answer | prompt) is the choice.

**The user's instructions** (`instruct`): `train_file` (and `dev_file`; without one, 10 % of the
training rows are held out) of Alpaca JSON or JSON Lines rows, `instruction` (+ `input`) and
`output`, or `prompt` and `response` (`tasks.data_files`). Each row is begin of text, the prompt
and the response and end of text (a prompt too long loses its start); clients come from
`client_column`, or IID (the rows have no labels to split by). Evaluation on the dev rows:
`loss` and `token_accuracy` of the response tokens (the likelihood of the reference answers) and
`accuracy`, the share of greedy generations (up to the longest reference's tokens, stopping at
end of text) that equal their reference answer, whitespace collapsed (exact match).

The model is `models.causal_lm.build_causal_lm` on the decoder with LoRA: logits (n, V) at the n
response positions, y the n response tokens (`with_response_targets`), so the engine's loss is
the response-only next-token cross-entropy and its "examples" are tokens.
"""

from __future__ import annotations

import collections
import pathlib
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from tasks import batching, instructions
from tasks.run_task import RunTask, counted, ordered, starting_non_trainable, train_size
from tasks.task_config import TaskConfig, TaskSpec
from tffl.simulation import evaluation
from tffl.simulation.metrics_log import announce

INSTRUCT_TASKS = ("sst2_instruct", "reviews_instruct", "instruct")
# The share of the training rows held out as the dev split when the user gives no dev file.
DEV_FRACTION = 0.1
# The most memory the one-pass evaluator keeps its frozen layers' outputs in (float32 bytes);
# a larger evaluated split runs every layer on every call.
PREFIX_CACHE_BYTES = 512 * 2**20
_PROMPT_HEAD, _PROMPT_TAIL = instructions.SENTIMENT_PROMPT.split("{text}")
# The held-out test split's measures are named with this prefix (test_accuracy, ...), as the
# classifier's (`tasks.text_run_task`).
HELDOUT_PREFIX = "test_"


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
    cut to its longest row w, and y its answer tokens (`models.causal_lm.with_response_targets`).

    With `width_multiple` m > 1 the batch is cut at ⌈w/m⌉·m instead (at most `max_width`), the
    extra columns padding (`pad_id`, both masks 0): a causal LM's logits at the response
    positions, and so the loss, do not see them. Batches then come in few widths, and a TFF
    worker's oneDNN kernels, which keep primitives per thread for each input shape they meet
    (TensorFlow's `MklPrimitiveFactory`), keep few (docs/PERFORMANCE.md).

    >>> appender = AnswerAppender([[7, 1], [8, 1]], pad_id=0, width_multiple=4)
    >>> x = {"token_ids": tf.constant([[2, 5, 6]]), "padding_mask": tf.constant([[1, 1, 1]])}
    >>> batch, y = appender(x, tf.constant([1]))
    >>> batch["token_ids"].numpy().tolist(), batch["response_mask"].numpy().tolist(), y.numpy()
    ([[2, 5, 6, 8, 1, 0, 0, 0]], [[0, 0, 0, 1, 1, 0, 0, 0]], array([8, 1], dtype=int32))
    """

    def __init__(self, answers: Sequence[Sequence[int]], pad_id: int, width_multiple: int = 1,
                 max_width: int | None = None):
        if width_multiple < 1:
            raise ValueError(f"width_multiple={width_multiple}: pass 1 (no rounding) or more")
        width = max(len(a) for a in answers)
        self.pad_id = pad_id
        self.table = tf.constant([list(a) + [pad_id] * (width - len(a)) for a in answers],
                                 tf.int32)
        self.lengths = tf.constant([len(a) for a in answers], tf.int32)
        self.width = width
        self.width_multiple, self.max_width = width_multiple, max_width

    def __call__(self, x, labels):
        from models import causal_lm

        widen = [[0, 0], [0, self.width + self.width_multiple - 1]]
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
        width = longest = tf.reduce_max(prompt_lengths + answer_lengths)
        if self.width_multiple > 1:
            width = -(-longest // self.width_multiple) * self.width_multiple
            if self.max_width is not None:
                width = tf.minimum(width, tf.maximum(self.max_width, longest))
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
    from models import causal_lm, lora_targets

    def build():
        backbone = decoder.backbone_fn()
        lora_targets.apply_lora(backbone, lora_config)
        return backbone, causal_lm.build_causal_lm(backbone)

    return build


def _check_targets(decoder, lora_config) -> None:
    """`lora_targets=...` in one line when the decoder's layers lack a target, `lora_layers=...`
    when it has no such layer (before any data is read or any weight loaded)."""
    missing = [t for t in lora_config.targets if t not in decoder.lora_targets]
    if missing:
        raise ValueError(f"lora_targets={','.join(lora_config.targets)}: {decoder.name}'s "
                         f"decoder layers have no {missing[0]!r} projection; its targets are "
                         f"{', '.join(decoder.lora_targets)}")
    n = decoder.num_layers
    outside = [i for i in lora_config.layers or () if n is not None and not 0 <= i < n]
    if outside:
        raise ValueError(f"lora_layers={','.join(map(str, lora_config.layers))}: "
                         f"{decoder.name} has {n} decoder layers, 0 to {n - 1}; layer "
                         f"{outside[0]} is not one of them")


def _prompts(dataset: tf.data.Dataset) -> tuple[list[list[int]], np.ndarray]:
    """The prompts of packed `(x, label)` rows (token lists, begin of text first) and labels."""
    x, y = zip(*dataset.batch(4096).as_numpy_iterator())
    token_ids = np.concatenate([b["token_ids"] for b in x])
    lengths = np.concatenate([b["padding_mask"] for b in x]).sum(1)
    return [list(map(int, row[:n])) for row, n in zip(token_ids, lengths)], np.concatenate(y)


def make_evaluator(lm_fn: Callable[[], tuple], task, decoder, answers, batch_size: int = 32,
                   heldout: tf.data.Dataset | None = None):
    """`weights -> {"loss", "token_accuracy", "accuracy", "unparseable",
    "likelihood_accuracy"}` on `task`'s evaluated split (module docstring), one model built on
    first call (after TFF has traced its computations). With `heldout` (packed `(x, label)`
    prompts of a held-out test split, e.g. SST-2's labeled test sentences), the same measures
    on it too, named `test_<measure>`, by the same model.

    When every answer is one token and end of text (`answers[c] = [a_c, end]`, as " negative"
    and " positive" are for Gemma 3), one forward pass per batch gives every measure
    (`_one_pass_evaluator`); otherwise the answers' tokens, greedy generation and the
    likelihood of each answer are three passes."""
    splits = {"": task.global_test_data}
    if heldout is not None:
        splits[HELDOUT_PREFIX] = heldout
    if all(len(a) == 2 and a[1] == decoder.eos_id for a in answers):
        return _one_pass_evaluator(lm_fn, splits, decoder, answers, batch_size)
    from models import decoders, lm_evaluation

    appender = AnswerAppender(answers, decoder.pad_id)
    cache = {}

    def model_fn():   # the answer-token model (one for every split); its backbone generates
        if "model" not in cache:
            cache["backbone"], cache["model"] = lm_fn()
            cache["prompts"] = {prefix: _prompts(data) for prefix, data in splits.items()}
        return cache["model"]

    # One graph per batch: a dataset loop inside one tf.function ran its body eagerly here
    # (Gemma 3's evaluation took minutes longer).
    answer_tokens = {prefix: evaluation.make_keras_evaluator(
        model_fn, lambda data=data: data.batch(batch_size).map(appender),
        graph_per_batch=True) for prefix, data in splits.items()}

    def evaluate(weights) -> dict[str, float]:
        measures = {}
        for prefix, split_tokens in answer_tokens.items():
            tokens = split_tokens(weights)   # assigns `weights` to the model and its backbone
            backbone, (prompts, labels) = cache["backbone"], cache["prompts"][prefix]
            generated = decoders.continuations(backbone, decoder, prompts,
                                               max(len(a) for a in answers) - 1, batch_size)
            matched = instructions.exact_match_accuracy(generated, labels)
            chosen = lm_evaluation.choose(backbone, prompts, [a[:-1] for a in answers],
                                          pad_id=decoder.pad_id, batch_size=batch_size)
            measures.update({
                f"{prefix}loss": tokens["loss"], f"{prefix}token_accuracy": tokens["accuracy"],
                f"{prefix}accuracy": matched["accuracy"],
                f"{prefix}unparseable": matched["unparseable"],
                f"{prefix}likelihood_accuracy": float(np.mean(chosen == labels))})
        return measures

    return evaluate


def _one_pass_evaluator(lm_fn: Callable[[], tuple], splits: dict[str, tf.data.Dataset], decoder,
                        answers, batch_size: int):
    """`make_evaluator` for one-token answers `answers[c] = [a_c, end]`, from one pass per batch,
    on each of `splits` ({metric prefix: packed `(x, label)` prompts}) with one model.

    Row i of a batch is its prompt p_i, its answer a_{y_i} and end of text; the causal LM's
    logits at its two response positions are z_i = h(p_i)·Eᵀ (the next token after the prompt)
    and z'_i = h(p_i, a_{y_i})·Eᵀ. With ℓ = log softmax:

        loss = −(1/2n) Σ_i (ℓ(z_i)[a_{y_i}] + ℓ(z'_i)[end])      (the answer tokens' mean)
        token_accuracy = (1/2n) Σ_i ([argmax z_i = a_{y_i}] + [argmax z'_i = end])
        greedy answer_i = argmax z_i (nothing if it is end of text: the generation stops)
        likelihood choice_i = argmax_c ℓ(z_i)[a_c]

    the same figures as the three passes (greedy generation of one token,
    `models.lm_evaluation.choose` over the answers, the answer tokens' loss). The rows are
    batched in order of prompt length, so that a batch is padded to little more than its
    rows (each measure is a sum over rows, so their order does not change it).

    The decoder layers below the lowest one holding a trained variable (layer k = 14 of Gemma 3
    270M's 18 at RoLoRA's budget) never change in a run. When the backbone can be entered at a
    layer (`models.gemma3_backbone.Gemma3Backbone.layer_input`, `from_layer`), every row's x_k
    is computed on the first call and kept (for each split whose x_k fits in
    `PREFIX_CACHE_BYTES`), and later calls run layers k..L−1 only. A fingerprint of a sample of
    the frozen weights (every ⌈size/4096⌉-th value of each array; a base by reference,
    `tffl.engine.frozen.FrozenValue`, is named by its file) is checked on every call: other
    frozen weights recompute x_k."""
    from models import causal_lm
    from tffl.engine import frozen

    appender = AnswerAppender(answers, decoder.pad_id)
    candidates = tf.constant([a[0] for a in answers], tf.int32)
    state = {}

    def measures(logits, y):   # logits (2b, V): z_i, z'_i per row
        log_p = tf.nn.log_softmax(logits)
        picked = tf.gather(log_p, y, axis=1, batch_dims=1)
        correct = tf.cast(tf.equal(tf.argmax(log_p, -1, output_type=tf.int32), y), tf.float32)
        after_prompt = log_p[0::2]
        return (tf.stack([-tf.reduce_sum(picked), tf.reduce_sum(correct),
                          tf.cast(tf.shape(y)[0], tf.float32)]),
                tf.argmax(after_prompt, -1, output_type=tf.int32),
                tf.gather(after_prompt, candidates, axis=1))

    def build() -> dict:
        backbone, model = lm_fn()
        datasets = {prefix: _by_length(data).batch(batch_size).map(
            lambda x, labels: (*appender(x, labels), labels)) for prefix, data in splits.items()}
        batches = {prefix: list(dataset) for prefix, dataset in datasets.items()}
        frozen_below = _frozen_layers(backbone, model)
        width = int(backbone.token_embedding.embeddings.shape[1])
        starts = {}
        for prefix in splits:
            cached = sum(int(np.prod(x["token_ids"].shape))
                         for x, _, _ in batches[prefix]) * width * 4
            starts[prefix] = frozen_below if cached <= PREFIX_CACHE_BYTES else 0

        # One graph for every batch, traced once for the batches' element spec (their width
        # and size unknown). Traced at a first batch's shape and then relaxed (another width,
        # a smaller last batch), the first evaluation took 13-44 s longer (docs/PERFORMANCE.md).
        x_spec, y_spec, _ = next(iter(datasets.values())).element_spec

        @tf.function(input_signature=[x_spec, y_spec])
        def whole(x, y):
            return measures(model(x, training=False), y)

        prefix_pass = suffix = None
        if any(starts.values()):
            prefix_pass = tf.function(lambda x: backbone.layer_input(x, frozen_below),
                                      input_signature=[x_spec])
            x_k = prefix_pass.get_concrete_function().structured_outputs

            @tf.function(input_signature=[
                x_spec, y_spec, tf.TensorSpec([None, None, x_k.shape[-1]], x_k.dtype)])
            def suffix(x, y, x_k):
                hidden = backbone.from_layer(x_k, x["padding_mask"], frozen_below)
                predicting = tf.gather_nd(hidden[:, :-1],
                                          causal_lm.response_indices(x["response_mask"]))
                return measures(causal_lm.output_logits(backbone.token_embedding, predicting),
                                y)

        return {"model": model, "batches": batches, "starts": starts, "whole": whole,
                "prefix": prefix_pass, "suffix": suffix, "x_k": {}, "keys": {}}

    def split_measures(prefix: str, key) -> dict[str, float]:
        batches, start = state["batches"][prefix], state["starts"][prefix]
        if start and state["keys"].get(prefix) != key:
            state["x_k"][prefix] = [state["prefix"](x) for x, _, _ in batches]
            state["keys"][prefix] = key
        sums, greedy, scores, labels = np.zeros(3), [], [], []
        for i, (x, y, batch_labels) in enumerate(batches):
            if start:
                totals, tokens, answer_scores = state["suffix"](x, y, state["x_k"][prefix][i])
            else:
                totals, tokens, answer_scores = state["whole"](x, y)
            sums += totals.numpy().astype(np.float64)
            greedy.append(tokens.numpy())
            scores.append(answer_scores.numpy())
            labels.append(batch_labels.numpy())
        loss_sum, correct, count = sums
        if count == 0:
            raise ValueError("the evaluation dataset has no examples; check the evaluated "
                             "split (e.g. --data_dir's dev or test file)")
        labels = np.concatenate(labels)
        greedy = np.concatenate(greedy)
        text = {int(t): decoder.detokenize([] if t == decoder.eos_id else [int(t)])
                for t in np.unique(greedy)}
        matched = instructions.exact_match_accuracy([text[int(t)] for t in greedy], labels)
        chosen = np.argmax(np.concatenate(scores), axis=1)
        return {f"{prefix}loss": loss_sum / count, f"{prefix}token_accuracy": correct / count,
                f"{prefix}accuracy": matched["accuracy"],
                f"{prefix}unparseable": matched["unparseable"],
                f"{prefix}likelihood_accuracy": float(np.mean(chosen == labels))}

    def evaluate(weights) -> dict[str, float]:
        if not state:
            state.update(build())
        frozen.assign_weights(weights, state["model"])   # a base by reference: read once
        key = None
        if any(state["starts"].values()):   # a base by reference is its file's own name
            key = tuple(v if isinstance(v, frozen.FrozenValue)
                        else frozen.fingerprint([np.ravel(v)[::max(1, np.size(v) // 4096)]])
                        for v in weights.non_trainable)
        out = {}
        for prefix in splits:
            out.update(split_measures(prefix, key))
        return out

    return evaluate


def _frozen_layers(backbone: tf.keras.Model, model: tf.keras.Model) -> int:
    """k: the lowest decoder layer of `backbone` holding one of `model`'s trainable variables,
    when every one of them lies in layers k..L−1 and the backbone can be entered at a layer
    (`from_layer`); else 0 (nothing below is fixed, or the backbone cannot be cut)."""
    if not hasattr(backbone, "from_layer"):
        return 0
    trained = {v.ref() for v in model.trainable_variables}
    held = [{v.ref() for v in layer.trainable_variables} & trained
            for layer in backbone.transformer_layers]
    start = next((k for k, refs in enumerate(held) if refs), 0)
    return start if trained and set().union(*held[start:]) == trained else 0


def _by_length(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """The packed prompts `(x, label)` of `dataset` (read once, into memory), longest prompt
    first (stable), each padded to the longest prompt. Longest first, so that each batch's
    buffers fit in the larger ones the batches before it freed: in increasing length, glibc's
    heap (the driver's allocator) could not reuse them (docs/PERFORMANCE.md)."""
    chunks = list(dataset.batch(4096).as_numpy_iterator())
    if not chunks:
        raise ValueError("the evaluation dataset has no examples; check the evaluated split "
                         "(e.g. --data_dir's dev or test file)")
    width = max(x["token_ids"].shape[1] for x, _ in chunks)

    def widened(a):
        return np.pad(a, [(0, 0), (0, width - a.shape[1])])

    token_ids = np.concatenate([widened(x["token_ids"]) for x, _ in chunks])
    padding_mask = np.concatenate([widened(x["padding_mask"]) for x, _ in chunks])
    labels = np.concatenate([y for _, y in chunks])
    order = np.argsort(-padding_mask.sum(axis=1), kind="stable")
    return tf.data.Dataset.from_tensor_slices((
        {"token_ids": token_ids[order], "padding_mask": padding_mask[order]}, labels[order]))


def _starting_non_trainable(lm_fn, decoder, lora_config, input_spec,
                            frozen_dir: str | None) -> Callable[[], list]:
    """`() -> non_trainable` starting frozen weights, computed once: the checkpoint's backbone
    for a pretrained decoder, else the model's random draw (kept under `frozen_dir` between
    calls: `tasks.run_task.starting_non_trainable`)."""

    def pretrained():
        from models import causal_lm, lora_targets

        if decoder.pretrained_values is None:
            backbone = decoder.pretrained_fn()
            lora_targets.apply_lora(backbone, lora_config)
            return [v.numpy()
                    for v in causal_lm.build_causal_lm(backbone).non_trainable_variables]
        # The checkpoint's values in the model's order, without an eager model: built in a
        # throw-away graph, its variables hold no memory (eagerly, the zeros they start at and
        # the values assigned to them held the base three times at once).
        with tf.Graph().as_default():
            backbone = decoder.backbone_fn()
            values = decoder.pretrained_values(backbone)
            lora_targets.apply_lora(backbone, lora_config)
            frozen = causal_lm.build_causal_lm(backbone).non_trainable_variables
            unset = [v.name for v in frozen if v.ref() not in values]
            if unset:
                raise ValueError(f"{decoder.name}: frozen weights without a checkpoint value: "
                                 f"{unset}")
            return [values.pop(v.ref()) for v in frozen]

    return starting_non_trainable(lambda: lm_fn()[1], input_spec,
                                  pretrained if decoder.pretrained_fn is not None else None,
                                  decoder.name, frozen_dir)


def _sentiment_task(spec: TaskSpec, decoder, lm_fn, input_spec) -> RunTask:
    """SST-2 (partitioned) or the five review domains (natural clients) as sentiment
    instructions (module docstring). A row's prompt keeps its last `sequence_length` − (answer
    tokens) tokens; `sequence_length` None is the decoder's positions (every SST-2 sentence
    whole), and each batch is cut to its longest row. With `bucket_by_length`, a round's
    examples are batched with neighbours in length (`tasks.batching`), else in drawn order."""
    import dataclasses

    from tasks import prefix_cache, text_run_task

    t = spec.task
    answers = _answers(decoder)
    answer_width = max(len(a) for a in answers)
    max_prompt = _check_lengths(t.sequence_length, decoder, answer_width)
    packer = PromptPacker(decoder.tokenizer, decoder.bos_id, decoder.pad_id, max_prompt)
    # The classifier's loader, on the same data and partitions (`tasks.text_run_task`).
    data = text_run_task.load_text_task(dataclasses.replace(
        spec, task=dataclasses.replace(t, task=t.task.removesuffix("_instruct"))), packer)
    task = data.task
    heldout = None
    if data.heldout is not None:   # SST-2's labeled test split (spec.eval_test)
        from tasks import client_data, text

        heldout = client_data.tensor_dataset(text.tokenize(data.heldout.segments, packer),
                                             data.heldout.labels)
    appender = AnswerAppender(answers, decoder.pad_id, batching.WIDTH_MULTIPLE,
                              max_prompt + answer_width)
    rounds = prefix_cache.TextRounds(
        lambda cid: prefix_cache.ClientExamples.from_dataset(
            task.train_data.create_tf_dataset_for_client(cid).map(ordered)),
        prefix_cache.RoundDraw(spec.local_steps, t.batch_size, spec.seed, t.bucket_by_length),
        client_ids=task.train_data.client_ids, name="train")
    return RunTask(
        description=_description(spec, task, decoder, "answers " + "/".join(
            repr(a) for a in instructions.SENTIMENT_ANSWERS)),
        client_ids=list(task.train_data.client_ids),
        client_dataset_fn=lambda cid, round_num: rounds.dataset(cid, round_num).map(appender),
        keras_model_fn=lambda: lm_fn()[1],
        input_spec=input_spec,
        evaluate=make_evaluator(lm_fn, task, decoder, answers, heldout=heldout),
        eval_split=data.eval_split,
        num_classes=len(answers),
    )


def _description(spec: TaskSpec, task, decoder, answers: str) -> str:
    t, m = spec.task, spec.model
    random = " (a test backbone)" if decoder.pretrained_fn is None else ""
    return (f"{task.name} ({train_size(task)} train examples, "
            f"{counted(len(task.train_data.client_ids), 'client')}; {decoder.description}"
            f"{random}, LoRA r={m.adapter_rank} on {','.join(m.lora_targets)}, {answers}, "
            f"L={t.sequence_length or f'up to {decoder.max_length} tokens'}; "
            f"{'batches bucketed by length' if t.bucket_by_length else 'drawn order'}, "
            "no prefix cache)")


def prompt_style(task: TaskConfig) -> str:
    """How the instruction task's training rows were prompted
    (`tasks.instructions.PROMPT_STYLES`), so that a bare prompt is prompted alike
    (`instructions.styled_prompt`): "sentiment" for sst2_instruct and reviews_instruct; for
    instruct, its `train_file`'s form (`tasks.data_files.instruction_form`): "alpaca",
    "as_written", or "mixed" for a file of both forms."""
    from tasks import data_files

    if task.task not in INSTRUCT_TASKS:
        raise ValueError(f"task={task.task}: not an instruction task ({', '.join(INSTRUCT_TASKS)})")
    if task.task != "instruct":
        return "sentiment"
    return data_files.instruction_form(task.train_file)


def instruct_run_task(spec: TaskSpec) -> RunTask:
    """The instruction task of `spec` for the decoder `spec.model.backbone`
    (`models.decoders`) with LoRA on `lora_targets` of `lora_layers` (module docstring)."""
    from models import decoders, lora_targets

    t, m = spec.task, spec.model
    if t.data_dir is None and t.task == "reviews_instruct":
        raise ValueError("data_dir is needed: task 'reviews_instruct' reads the five review "
                         "domains from a folder; pass data_dir=<folder with "
                         "multidomain_sentiment/>, e.g. ../shared/data")
    if t.task == "instruct" and t.train_file is None:
        raise ValueError("task 'instruct' reads its rows from train_file=<Alpaca JSON or JSON "
                         "Lines file>")
    if spec.eval_test and t.task != "sst2_instruct":
        raise ValueError(f"eval_test=True: task {t.task!r} evaluates one split; it has no "
                         "held-out test split beside it")
    if spec.eval_test and t.data_dir is None:
        raise ValueError("eval_test=True: TFDS's SST-2 test split is unlabelled; pass "
                         "data_dir=<folder with sst2/test-labeled.tsv>")
    if m.backbone not in decoders.DECODERS:
        raise ValueError(f"backbone={m.backbone}: task {t.task!r} trains a decoder language "
                         f"model; choose one of {', '.join(decoders.DECODERS)}")
    lora_config = lora_targets.LoraConfig(rank=m.adapter_rank, alpha=m.lora_alpha,
                                         targets=m.lora_targets, layers=m.lora_layers,
                                         seed=spec.seed)
    announce(f"building the {m.backbone} decoder and its tokenizer")
    decoder = decoders.build_decoder(m.backbone, m.base_dtype)
    _check_targets(decoder, lora_config)
    lm_fn = _lm_builder(decoder, lora_config)
    input_spec = (collections.OrderedDict(
        (k, tf.TensorSpec([None, None], tf.int32))
        for k in ("padding_mask", "response_mask", "token_ids")), tf.TensorSpec([None], tf.int32))
    if t.task == "instruct":
        run = _user_instruction_task(spec, decoder, lm_fn, input_spec)
    else:
        run = _sentiment_task(spec, decoder, lm_fn, input_spec)
    non_trainable = _starting_non_trainable(lm_fn, decoder, lora_config, input_spec,
                                            m.frozen_dir)
    run.pretrained_non_trainable = non_trainable if decoder.pretrained_fn else None
    run.random_backbone = decoder.pretrained_fn is None or decoder.random_weights
    run.decoder = decoder
    return run


def _instruction_splits(spec: TaskSpec):
    """`(train, dev, dev's name)`: the user's instruction rows (`tasks.data_files`), the dev
    rows being the dev file's, else `DEV_FRACTION` of the training rows held out at random."""
    from tasks import data_files

    t = spec.task
    announce(f"reading {t.train_file}")
    train = data_files.read_instruction_rows(t.train_file, t.client_column)
    if t.dev_file is not None:
        client = t.client_column if t.client_column in data_files.columns_of(t.dev_file) else None
        return train, data_files.read_instruction_rows(t.dev_file, client), "dev"
    if len(train) < 2:
        raise ValueError(f"{t.train_file}: {len(train)} row; hold out a dev split from at least "
                         "2 rows, or give dev_file=<file>")
    order = np.random.default_rng(spec.seed).permutation(len(train))
    cut = max(1, round(DEV_FRACTION * len(train)))
    announce(f"no dev_file: {cut} of the {len(train)} rows of {t.train_file} held out as the "
             "dev split")
    return (train.subset(np.sort(order[cut:])), train.subset(np.sort(order[:cut])),
            "dev")


def _packed(rows, decoder, sequence_length: int | None) -> dict[str, np.ndarray]:
    """`instructions.pack`'s int32 (n, w) arrays of the rows (begin of text, prompt, response,
    end of text), w the longest row within `sequence_length` (None: the decoder's positions)."""
    cap = sequence_length or decoder.max_length
    if cap > decoder.max_length:
        raise ValueError(f"sequence_length={cap}: {decoder.name} has {decoder.max_length} "
                         "positions; pass at most that")
    texts = sorted(set(rows.prompts) | set(rows.responses))
    ids = dict(zip(texts, decoder.tokenize(texts)))
    longest = max(len(ids[p]) + len(ids[r]) + 2 for p, r in zip(rows.prompts, rows.responses))
    return instructions.pack(rows.examples(), ids.__getitem__, min(cap, longest),
                             pad_id=decoder.pad_id, end_id=decoder.eos_id,
                             start_id=decoder.bos_id)


def _user_instruction_task(spec: TaskSpec, decoder, lm_fn, input_spec) -> RunTask:
    """The user's instruction rows (module docstring): clients by `client_column`, else IID."""

    from models import causal_lm
    from tasks import client_data as client_data_lib
    from tasks import data_files, partition_schemes, prefix_cache
    from tasks import task as task_lib

    t = spec.task
    train, dev, dev_name = _instruction_splits(spec)
    data_files.check_clients_known(dev, train, t.client_column)
    announce(f"tokenizing {len(train) + len(dev)} instructions")
    train_x, dev_x = (_packed(rows, decoder, t.sequence_length) for rows in (train, dev))
    zeros = np.zeros(len(train), np.int32)
    if train.clients is not None:
        parts = partition_schemes.by_group(train.clients, 1, spec.seed)
    else:
        parts = partition_schemes.partition(zeros, t.num_clients, "iid", spec.seed)
    train_data = client_data_lib.ArrayClientData(train_x, zeros, parts)
    dev_y = np.zeros(len(dev), np.int32)
    task = task_lib.Task(pathlib.Path(t.train_file).name, train_data, None,
                         client_data_lib.tensor_dataset(dev_x, dev_y),
                         train_data.element_type_structure, 0,
                         info={"train_sizes": {c: len(i) for c, i in parts.items()}})
    rounds = prefix_cache.TextRounds(
        lambda cid: prefix_cache.ClientExamples.from_dataset(
            train_data.create_tf_dataset_for_client(cid).map(ordered)),
        prefix_cache.RoundDraw(spec.local_steps, t.batch_size, spec.seed, t.bucket_by_length,
                               batching.WIDTH_MULTIPLE),
        client_ids=train_data.client_ids, name="train")

    def targets(x, labels):
        del labels
        return causal_lm.with_response_targets(x)

    return RunTask(
        description=_description(spec, task, decoder, "free-form responses"),
        client_ids=list(train_data.client_ids),
        client_dataset_fn=lambda cid, round_num: rounds.dataset(cid, round_num).map(targets),
        keras_model_fn=lambda: lm_fn()[1],
        input_spec=input_spec,
        evaluate=make_response_evaluator(lm_fn, dev, dev_x, decoder),
        eval_split=dev_name,
    )


def make_response_evaluator(lm_fn: Callable[[], tuple], rows, packed: dict, decoder,
                            batch_size: int = 32):
    """`weights -> {"loss", "token_accuracy", "accuracy"}` on the dev rows (module docstring):
    the reference responses' token loss and accuracy, and the exact-match share of greedy
    generations; one model built on first call (after TFF has traced its computations)."""
    from models import causal_lm, decoders

    dev = tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
        (k, packed[k]) for k in sorted(packed)))
    prompts = [list(map(int, row[:np.flatnonzero(r)[0]])) if r.any() else list(map(int, row))
               for row, r in zip(packed["token_ids"], packed["response_mask"])]
    longest = int(packed["response_mask"].sum(axis=1).max())
    cache = {}

    def model_fn():
        cache["backbone"], model = lm_fn()
        return model

    response_tokens = evaluation.make_keras_evaluator(
        model_fn, lambda: dev.batch(batch_size).map(causal_lm.with_response_targets),
        graph_per_batch=True)

    def evaluate(weights) -> dict[str, float]:
        tokens = response_tokens(weights)   # assigns `weights` to the model (and its backbone)
        generated = decoders.continuations(cache["backbone"], decoder, prompts, longest,
                                           batch_size)
        matched = [" ".join(g.split()) == " ".join(reference.split())
                   for g, reference in zip(generated, rows.responses)]
        return {"loss": tokens["loss"], "token_accuracy": tokens["accuracy"],
                "accuracy": float(np.mean(matched))}

    return evaluate
