"""Causal language modelling on a KerasNLP decoder backbone: next-token loss on response tokens only.

A batch is `{"token_ids": (B, T) int32, "padding_mask": (B, T), "response_mask": (B, T)}`, where
`response_mask[b, t] = 1` when token t of sequence b belongs to the response (a target): prompt and
padding are 0. The hidden state at position t predicts token t + 1, so the targets are
`token_ids[:, 1:]` where `response_mask[:, 1:] = 1`, predicted from `hidden[:, :-1]`:

    loss = (1/n) Σ_{(b,t): m[b,t+1] = 1} −log softmax(h[b,t] · Eᵀ)[x[b,t+1]],  n = Σ m[:, 1:]

with E the output embedding (GPT-2 ties it to the input embedding; Llama and Mistral do not:
KerasNLP's `ReversibleEmbedding(reverse=True)` covers both). Only the n response positions are
projected onto the vocabulary (`response_logits`): with a vocabulary of 32k-256k and short
responses after long prompts, the (B, T, V) logits of every position would dominate the step.

For `tffl`'s engine, whose client loop takes a Keras model `x -> pred` and a loss `(y, pred)`,
`build_causal_lm(backbone)` is the model `{token_ids, padding_mask, response_mask} -> logits
(n, V)` at the response positions, and `with_response_targets(batch)` the matching `(x, y)`: y
the n target tokens in the same (row-major) order. A batch's "size" n is then its number of response tokens, so
the engine's loss sums weigh tokens, and its correct-prediction count is next-token accuracy.

The frozen-prefix cache (as `models.prefix` for the encoders): when every trained variable lies in
decoder layers k..L-1, h_k (the input of layer k) is a fixed function of the tokens.
`build_prefix(backbone, k)` maps the backbone's inputs to `{"hidden": h_k, "padding_mask"}`, and
`build_suffix_lm(backbone, k)` maps those and `response_mask` to the same response logits through
layers k..L-1, the final norm and the output embedding (the same layer objects, so the same
weights). The prefix must have no active dropout (checked).

Evaluation, one prompt at a time, without a key/value cache (answers of a few
tokens): `greedy_generate` appends the most likely token until a stop token or a length limit;
`continuation_log_likelihood` scores a candidate answer, Σ_j log p(c_j | prompt, c_<j), and
`choose_by_likelihood` picks the most likely of several.

Example (a tiny random GPT-2; the response is the last two tokens of the first sequence):

>>> import keras_nlp, numpy as np
>>> backbone = keras_nlp.models.GPT2Backbone(vocabulary_size=20, num_layers=1, num_heads=1,
...     hidden_dim=4, intermediate_dim=8, max_sequence_length=8)
>>> batch = {"token_ids": np.array([[1, 2, 3, 4], [5, 6, 0, 0]], np.int32),
...          "padding_mask": np.array([[1, 1, 1, 1], [1, 1, 0, 0]], np.int32),
...          "response_mask": np.array([[0, 0, 1, 1], [0, 0, 0, 0]], np.int32)}
>>> logits, targets = response_logits(backbone, batch)
>>> logits.shape, targets.numpy().tolist()
(TensorShape([2, 20]), [3, 4])
>>> float(response_loss(backbone, batch)) > 0
True
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from models import base_precision


def output_logits(embedding: tf.keras.layers.Layer, hidden: tf.Tensor) -> tf.Tensor:
    """hidden (..., H) -> logits (..., V) = hidden · Eᵀ: `embedding(hidden, reverse=True)` for a
    KerasNLP `ReversibleEmbedding`, without the transposed copy of a tied E that its `call`
    makes first (`ops.transpose(E)`: 671 MB per call for Gemma 3 270M's (262,144, 640) table,
    in every training step and evaluation batch unless a graph optimizer folds it into the
    product). A tied E multiplies as `matmul(hidden, E, transpose_b=True)`; an untied output
    embedding, or another layer, is called as it is.

    >>> import keras_nlp, numpy as np
    >>> embedding = keras_nlp.layers.ReversibleEmbedding(7, 3)
    >>> hidden = np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32)
    >>> np.allclose(output_logits(embedding, hidden), embedding(hidden, reverse=True), atol=1e-6)
    True
    """
    if not (getattr(embedding, "tie_weights", False) and hasattr(embedding, "embeddings")):
        return embedding(hidden, reverse=True)
    dtype = getattr(embedding, "reverse_dtype", None) or embedding.compute_dtype
    table = tf.convert_to_tensor(embedding.embeddings)   # its stored dtype: no autocast here
    hidden = tf.cast(hidden, dtype)
    flat = hidden if hidden.shape.rank == 2 else tf.reshape(hidden, [-1, tf.shape(hidden)[-1]])
    scale = getattr(embedding, "embeddings_scale", None)   # an int8 table's
    if table.dtype == dtype:
        logits = tf.matmul(flat, table, transpose_b=True)
    else:
        logits = widened_product(flat, table, scale=(
            None if scale is None else tf.convert_to_tensor(scale)))
    if hidden.shape.rank == 2:
        return logits
    return tf.reshape(logits, tf.concat([tf.shape(hidden)[:-1], tf.shape(table)[:1]], 0))


# Rows of a lower-precision output embedding widened at once (`widened_product`): 16,384 rows
# of Gemma 3's width 640 are 42 MB in float32, against 671 MB for the whole table.
WIDENED_ROWS = 16_384


def widened_product(hidden: tf.Tensor, table: tf.Tensor, rows: int = WIDENED_ROWS,
                    scale: tf.Tensor | None = None) -> tf.Tensor:
    """hidden (n, H) · widen(table (V, H))ᵀ -> (n, V) in `hidden`'s dtype, for a table stored at
    a lower precision (`models.base_precision`), widened `rows` rows at a time: the product of
    block j is hidden · widen(E_j)ᵀ, the logits their concatenation. widen is a cast, or for an
    int8 table with its `scale` (V, G) (`base_precision.absmax_int8` along H), float32(q)·s
    (`base_precision.widen`). The gradient with respect to hidden, Σ_j ∂L/∂logits_j · widen(E_j),
    widens the blocks again rather than keeping them from the forward pass, so no whole widened
    copy of the table is ever live; the table (frozen) gets none. Eagerly the gradient is a
    `tf.custom_gradient`; in a graph it is registered once for every graph
    (`_recorded_product`), so that a traced graph is freed with its last reference.

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> table = tf.cast(rng.normal(size=(10, 3)), tf.bfloat16)
    >>> wide = tf.cast(table, tf.float32).numpy()
    >>> hidden = tf.constant(rng.normal(size=(2, 3)), tf.float32)
    >>> with tf.GradientTape() as tape:
    ...     _ = tape.watch(hidden)
    ...     logits = widened_product(hidden, table, rows=4)   # blocks of 4, 4 and 2 rows
    ...     loss = tf.reduce_sum(tf.sin(logits))
    >>> bool(np.allclose(logits, hidden.numpy() @ wide.T, atol=1e-6))
    True
    >>> expected = np.cos(hidden.numpy() @ wide.T) @ wide        # d/dh Σ sin(h·Eᵀ)
    >>> bool(np.allclose(tape.gradient(loss, hidden), expected, atol=1e-5))
    True

    An int8 table with a scale per row (G = 1) is the product with E = q·s, gradient included:

    >>> q = tf.constant(rng.integers(-127, 128, size=(10, 3)), tf.int8)
    >>> s = rng.uniform(0.01, 0.1, size=(10, 1)).astype(np.float32)
    >>> e = q.numpy().astype(np.float32) * s
    >>> with tf.GradientTape() as tape:
    ...     _ = tape.watch(hidden)
    ...     logits = widened_product(hidden, q, rows=4, scale=s)
    ...     loss = tf.reduce_sum(tf.sin(logits))
    >>> bool(np.allclose(logits, hidden.numpy() @ e.T, atol=1e-5))
    True
    >>> expected = np.cos(hidden.numpy() @ e.T) @ e
    >>> bool(np.allclose(tape.gradient(loss, hidden), expected, atol=1e-5))
    True
    """
    if tf.executing_eagerly():
        @tf.custom_gradient
        def product(h, stored):
            def gradient(upstream):
                return _input_gradient(upstream, stored, scale, rows), None
            return _blockwise_logits(h, stored, scale, rows), gradient

        return product(hidden, table)
    return _recorded_product(hidden, table, scale, rows)


# The gradient of `widened_product` in a graph, registered once: `tf.custom_gradient` registers
# a new gradient function for every graph it is traced in, and that function holds the graph's
# tensors, so every traced graph (a TFF computation's, with its whole model) stayed in memory
# for the rest of the process.
_PRODUCT_GRADIENT = "TfflWidenedProduct"


def _block_sizes(vocabulary: int, rows: int) -> list[int]:
    return [min(rows, vocabulary - start) for start in range(0, vocabulary, rows)]


def _in_turn(first, count: int, product):
    """`product(j)` for j < `count`, each computed only once the previous product (the first:
    once `first`) is. A graph runs any op whose inputs are ready, and a frozen block's widening
    needs none of the step's data, so unchained all of them ran at once as the step began: 32
    widened blocks, the whole table twice in float32, were live together in a TFF worker
    (heaptrack, docs/PERFORMANCE.md)."""
    out, previous = [], first
    for j in range(count):
        with tf.control_dependencies([previous]):
            previous = product(j)
        out.append(previous)
    return out


def _widened_blocks(table, scale, rows: int, dtype):
    """`block(j)` -> widen(E_j) in `dtype`, E_j rows [j·rows, (j + 1)·rows) of `table`."""
    sizes = _block_sizes(int(table.shape[0]), rows)
    blocks = tf.split(table, sizes, axis=0)
    scales = None if scale is None else tf.split(scale, sizes, axis=0)

    def block(j):
        if scales is None:
            return tf.cast(blocks[j], dtype)
        return tf.cast(base_precision.widen(blocks[j], scales[j], axis=1), dtype)

    return block, sizes


def _blockwise_logits(hidden, table, scale, rows: int):
    """hidden · widen(table)ᵀ, one block of rows widened at a time."""
    block, sizes = _widened_blocks(table, scale, rows, hidden.dtype)
    return tf.concat(_in_turn(hidden, len(sizes),
                              lambda j: tf.matmul(hidden, block(j), transpose_b=True)), axis=1)


def _input_gradient(upstream, table, scale, rows: int):
    """Σ_j ∂L/∂logits_j · widen(E_j), each block widened again."""
    block, sizes = _widened_blocks(table, scale, rows, upstream.dtype)
    parts = tf.split(upstream, sizes, axis=1)
    return tf.add_n(_in_turn(upstream, len(sizes), lambda j: tf.matmul(parts[j], block(j))))


def _recorded_product(hidden, table, scale, rows: int):
    """`widened_product` in a graph, with the gradient of `tf.custom_gradient` but not its
    per-graph registration: the logits pass through an IdentityN whose gradient is
    `_PRODUCT_GRADIENT` (for `tf.gradients`, reading its inputs [logits, hidden, table, rows,
    scale?]), recorded on any active tape with the same gradient (for `tf.GradientTape`,
    whose record ends with the tape)."""
    from tensorflow.python.eager import record

    logits = _blockwise_logits(hidden, table, scale, rows)
    inputs = [logits, hidden, table, tf.constant(rows, tf.int32)]
    if scale is not None:
        inputs.append(tf.convert_to_tensor(scale))
    with tf.compat.v1.get_default_graph().gradient_override_map(
            {"IdentityN": _PRODUCT_GRADIENT}):
        outputs = tf.identity_n(inputs)

    def backward(upstream, *unused):
        del unused
        return _identity_gradients(len(inputs), upstream, table, scale, rows)

    record.record_operation("WidenedProduct", outputs, inputs, backward)
    return outputs[0]


@tf.RegisterGradient(_PRODUCT_GRADIENT)
def _product_gradient(op, upstream, *unused):
    """`_recorded_product`'s gradient for `tf.gradients`: ∂L/∂hidden only."""
    del unused
    table, rows = op.inputs[2], int(tf.get_static_value(op.inputs[3]))
    scale = op.inputs[4] if len(op.inputs) > 4 else None
    return _identity_gradients(len(op.inputs), upstream, table, scale, rows)


def _identity_gradients(count: int, upstream, table, scale, rows: int) -> list:
    """The gradients of `_recorded_product`'s IdentityN inputs [logits, hidden, ...]: none for
    the logits (nothing flows back through the forward blocks), ∂L/∂hidden, none for the rest."""
    return [None, _input_gradient(upstream, table, scale, rows)] + [None] * (count - 2)


def response_indices(response_mask: tf.Tensor) -> tf.Tensor:
    """(n, 2) int64 `[b, t]`: the positions whose hidden state predicts a response token
    (token t + 1 of sequence b)."""
    return tf.where(tf.cast(response_mask, tf.bool)[:, 1:])


def response_logits(backbone: tf.keras.Model, batch: dict, training: bool = False
                    ) -> tuple[tf.Tensor, tf.Tensor]:
    """`(logits (n, V), targets (n,))` at the response positions of `batch` only."""
    hidden = backbone({"token_ids": batch["token_ids"], "padding_mask": batch["padding_mask"]},
                      training=training)
    indices = response_indices(batch["response_mask"])
    predicting = tf.gather_nd(hidden[:, :-1], indices)
    targets = tf.gather_nd(tf.convert_to_tensor(batch["token_ids"])[:, 1:], indices)
    return output_logits(backbone.token_embedding, predicting), targets


def response_loss(backbone: tf.keras.Model, batch: dict, training: bool = False) -> tf.Tensor:
    """The mean next-token cross-entropy over the response tokens of `batch` (0 if it has none:
    a batch of prompts only adds nothing, rather than NaN)."""
    logits, targets = response_logits(backbone, batch, training)
    losses = tf.keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True)
    count = tf.cast(tf.shape(targets)[0], losses.dtype)
    return tf.math.divide_no_nan(tf.reduce_sum(losses), count)


class ResponseLogits(tf.keras.layers.Layer):
    """`(hidden (B, T, H), response_mask (B, T)) -> logits (n, V)`: the backbone's output
    embedding applied to the hidden states that predict response tokens (`response_indices`).

    It shares the backbone's embedding layer, so it has no config of its own: a causal LM is
    rebuilt from its backbone (`build_causal_lm`), as LoRA is re-applied (`models.lora_targets`).
    """

    def __init__(self, embedding: tf.keras.layers.Layer, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embedding

    def get_config(self):
        raise NotImplementedError(
            "ResponseLogits shares its backbone's embedding layer and cannot be serialized alone; "
            "rebuild the model with models.causal_lm.build_causal_lm(backbone)")

    def call(self, hidden, response_mask):
        predicting = tf.gather_nd(hidden[:, :-1], response_indices(response_mask))
        return output_logits(self.embedding, predicting)


def build_causal_lm(backbone: tf.keras.Model) -> tf.keras.Model:
    """The Keras model `{"token_ids", "padding_mask", "response_mask"} -> logits (n, V)`."""
    inputs = {name: tf.keras.Input(shape=(None,), dtype="int32", name=name)
              for name in ("token_ids", "padding_mask", "response_mask")}
    hidden = backbone({"token_ids": inputs["token_ids"], "padding_mask": inputs["padding_mask"]})
    logits = ResponseLogits(backbone.token_embedding, name="response_logits")(
        hidden, inputs["response_mask"])
    return tf.keras.Model(inputs, logits, name="causal_lm")


def backbone_of(model: tf.keras.Model) -> tf.keras.Model:
    """The decoder backbone inside a `build_causal_lm` model (the same layer object: its
    weights are the model's), e.g. to generate with a trained causal LM.

    >>> import keras_nlp
    >>> backbone = keras_nlp.models.GPT2Backbone(vocabulary_size=20, num_layers=1, num_heads=1,
    ...     hidden_dim=4, intermediate_dim=8, max_sequence_length=8)
    >>> backbone_of(build_causal_lm(backbone)) is backbone
    True
    """
    logits = [layer for layer in model.layers if isinstance(layer, ResponseLogits)]
    found = [layer for layer in model.layers if isinstance(layer, tf.keras.Model)
             and len(logits) == 1 and getattr(layer, "token_embedding", None)
             is logits[0].embedding]
    if len(found) != 1:
        raise ValueError(f"model {model.name!r} is not a causal LM of build_causal_lm (a "
                         "backbone whose token embedding computes its response logits)")
    return found[0]


def _check_start_layer(backbone: tf.keras.Model, start_layer: int) -> None:
    layers = backbone.transformer_layers
    if not 0 <= start_layer < len(layers):
        raise ValueError(f"start_layer={start_layer}: the backbone has decoder layers 0.."
                         f"{len(layers) - 1}")
    below = [backbone.get_layer(n) for n in ("embeddings_dropout",) if _has_layer(backbone, n)]
    below += list(layers[:start_layer])
    rates = [getattr(layer, "rate", getattr(layer, "dropout", 0)) or 0 for layer in below]
    if any(float(r) > 0 for r in rates):
        raise ValueError(f"the layers below decoder layer {start_layer} have dropout "
                         f"{max(rates)}: their output is not fixed, so it cannot be cached")


def _has_layer(model: tf.keras.Model, name: str) -> bool:
    return any(layer.name == name for layer in model.layers)


def build_prefix(backbone: tf.keras.Model, start_layer: int) -> tf.keras.Model:
    """`{"token_ids", "padding_mask"} -> {"hidden": h_k (B, T, H), "padding_mask"}`: the
    backbone's embeddings and decoder layers below `start_layer` = k."""
    _check_start_layer(backbone, start_layer)
    hidden = backbone.transformer_layers[start_layer].get_input_at(0)
    padding = backbone.input["padding_mask"]
    return tf.keras.Model(backbone.input, {"hidden": hidden, "padding_mask": padding},
                          name=f"prefix_below_{start_layer}")


def build_suffix_lm(backbone: tf.keras.Model, start_layer: int) -> tf.keras.Model:
    """`{"hidden": h_k, "padding_mask", "response_mask"} -> logits (n, V)`: decoder layers
    k..L-1 of `backbone`, its final norm and output embedding (`build_causal_lm` from h_k)."""
    _check_start_layer(backbone, start_layer)
    width = backbone.transformer_layers[start_layer].get_input_at(0).shape[-1]
    inputs = {"hidden": tf.keras.Input(shape=(None, width), name="hidden"),
              "padding_mask": tf.keras.Input(shape=(None,), dtype="int32", name="padding_mask"),
              "response_mask": tf.keras.Input(shape=(None,), dtype="int32",
                                              name="response_mask")}
    x = inputs["hidden"]
    for layer in backbone.transformer_layers[start_layer:]:
        x = layer(x, decoder_padding_mask=inputs["padding_mask"])
    x = backbone.layer_norm(x)   # the final norm: GPT-2, Llama and Mistral name it so
    logits = ResponseLogits(backbone.token_embedding, name="response_logits")(
        x, inputs["response_mask"])
    return tf.keras.Model(inputs, logits, name=f"suffix_lm_from_{start_layer}")


def with_response_targets(x: dict) -> tuple[dict, tf.Tensor]:
    """A batch `x` -> `(x, y)`, y its response tokens (int32 (n,), in `response_indices`'
    row-major order): `dataset.batch(k).map(with_response_targets)`."""
    indices = response_indices(x["response_mask"])
    return x, tf.gather_nd(tf.convert_to_tensor(x["token_ids"])[:, 1:], indices)


def _last_logits(backbone: tf.keras.Model, token_ids: Sequence[int]) -> np.ndarray:
    ids = np.asarray([token_ids], np.int32)
    hidden = backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    return output_logits(backbone.token_embedding, hidden[:, -1]).numpy()[0]


def greedy_generate(backbone: tf.keras.Model, prompt_ids: Sequence[int], max_new_tokens: int,
                    stop_ids: Sequence[int] = ()) -> list[int]:
    """The greedy continuation of `prompt_ids`: at most `max_new_tokens` tokens, ending before
    the first token of `stop_ids` (which is not returned)."""
    if not len(prompt_ids):
        raise ValueError("greedy_generate needs a prompt of at least one token")
    generated: list[int] = []
    for _ in range(max_new_tokens):
        token = int(np.argmax(_last_logits(backbone, list(prompt_ids) + generated)))
        if token in stop_ids:
            break
        generated.append(token)
    return generated


def continuation_log_likelihood(backbone: tf.keras.Model, prompt_ids: Sequence[int],
                                continuation_ids: Sequence[int]) -> float:
    """log p(continuation | prompt) = Σ_j log softmax(h_{j−1} · Eᵀ)[c_j], natural log."""
    if not len(prompt_ids) or not len(continuation_ids):
        raise ValueError("continuation_log_likelihood needs a prompt and a continuation")
    ids = np.asarray([list(prompt_ids) + list(continuation_ids)], np.int32)
    response = np.zeros_like(ids)
    response[0, len(prompt_ids):] = 1
    logits, targets = response_logits(
        backbone, {"token_ids": ids, "padding_mask": np.ones_like(ids), "response_mask": response})
    log_probs = tf.nn.log_softmax(logits)
    picked = tf.gather(log_probs, targets, axis=1, batch_dims=1)
    return float(tf.reduce_sum(picked))


def choose_by_likelihood(backbone: tf.keras.Model, prompt_ids: Sequence[int],
                         candidates: Sequence[Sequence[int]]) -> int:
    """The index of the candidate continuation with the highest log-likelihood."""
    scores = [continuation_log_likelihood(backbone, prompt_ids, c) for c in candidates]
    return int(np.argmax(scores))
