"""KerasNLP BERT/RoBERTa backbones with small defaults, and a sequence-classification head.

`build_classifier(backbone, num_classes, pooling, head)` returns a functional `tf.keras.Model`
taking the backbone's input dict and returning logits (batch, num_classes):

    features = pool(h_L, mask)        mean: Σ_t m_t h_t / Σ_t m_t;  cls: h_0;  pooler: tanh(h_0 W_p)
    logits   = head(features)         linear: f·W + b;  dense_tanh: tanh(f·W_d + b_d)·W + b

h_L is the backbone's last hidden state (batch, seq, hidden) and m its padding mask. Every weight
after h_L (the head's, and BERT's pooler with pooling="pooler") carries the `head` role and
trains: the classifier never reads a frozen layer that the checkpoint did not train for it. The
pooling a checkpoint was trained with is `models.checkpoints.declared_pooling`.
"""

import keras_nlp
import tensorflow as tf

from models.classifier_options import HEADS, POOLINGS
from tffl.engine import roles


def build_bert_backbone(
    vocabulary_size: int = 30522,
    num_layers: int = 2,
    num_heads: int = 2,
    hidden_dim: int = 32,
    intermediate_dim: int = 64,
    dropout: float = 0.0,
    max_sequence_length: int = 128,
    num_segments: int = 2,
) -> keras_nlp.models.BertBackbone:
    """A randomly initialized KerasNLP `BertBackbone` (small by default, for tests and demos).

    Example:

    >>> backbone = build_bert_backbone(vocabulary_size=100)
    >>> backbone.num_layers, backbone.hidden_dim
    (2, 32)
    """
    return keras_nlp.models.BertBackbone(
        vocabulary_size=vocabulary_size,
        num_layers=num_layers,
        num_heads=num_heads,
        hidden_dim=hidden_dim,
        intermediate_dim=intermediate_dim,
        dropout=dropout,
        max_sequence_length=max_sequence_length,
        num_segments=num_segments,
    )


def build_roberta_backbone(
    vocabulary_size: int = 50265,
    num_layers: int = 2,
    num_heads: int = 2,
    hidden_dim: int = 32,
    intermediate_dim: int = 64,
    dropout: float = 0.0,
    max_sequence_length: int = 128,
) -> keras_nlp.models.RobertaBackbone:
    """A randomly initialized KerasNLP `RobertaBackbone` (small by default).

    RoBERTa-Large as in RoLoRA is `num_layers=24, num_heads=16, hidden_dim=1024,
    intermediate_dim=4096, max_sequence_length=512` (weights are not loaded here).

    Example:

    >>> backbone = build_roberta_backbone(vocabulary_size=100, num_layers=3)
    >>> len(backbone.transformer_layers)
    3
    """
    return keras_nlp.models.RobertaBackbone(
        vocabulary_size=vocabulary_size,
        num_layers=num_layers,
        num_heads=num_heads,
        hidden_dim=hidden_dim,
        intermediate_dim=intermediate_dim,
        dropout=dropout,
        max_sequence_length=max_sequence_length,
    )


def build_classifier(
    backbone: tf.keras.Model,
    num_classes: int,
    dropout: float = 0.0,
    seed: int = 0,
    name: str = "classifier",
    pooling: str = "mean",
    head: str = "linear",
) -> tf.keras.Model:
    """Backbone → pooled features (`pool`) → head (`classifier_head`) → logits.

    The backbone object is reused (not copied), so LoRA applied to it before or after this call
    is part of the classifier. Every head weight is tagged `head`; with `pooling="pooler"` so
    is BERT's pooler, which then trains: no frozen layer lies between the backbone's last hidden
    state and the logits.

    Args:
      pooling: "mean" (the padding-masked mean of the last hidden state, as sentence-transformers
        checkpoints such as all-MiniLM-L6-v2 were trained), "cls" (the first token's hidden
        state) or "pooler" (BERT's tanh(Dense(h_[CLS])), trained as part of the head).
      head: "linear" (Dense(num_classes)) or "dense_tanh" (RoBERTa's classification head:
        Dense(hidden) + tanh, then Dense(num_classes)).

    Example:

    >>> model = build_classifier(build_bert_backbone(vocabulary_size=100), num_classes=3)
    >>> batch = {"token_ids": tf.ones((2, 6), tf.int32), "segment_ids": tf.zeros((2, 6), tf.int32),
    ...          "padding_mask": tf.ones((2, 6), tf.int32)}
    >>> model(batch).shape
    TensorShape([2, 3])
    """
    if num_classes <= 0:
        raise ValueError(f"num_classes must be positive, got num_classes={num_classes!r}.")
    _check_choice("pooling", pooling, POOLINGS)
    _check_choice("head", head, HEADS)
    inputs = {k: tf.keras.Input(shape=(None,), dtype="int32", name=k) for k in backbone.input}
    outputs = backbone(inputs)
    sequence = outputs["sequence_output"] if isinstance(outputs, dict) else outputs
    pooler = None
    if pooling == "pooler":
        pooler = getattr(backbone, "pooled_dense", None)
        if pooler is None:
            raise ValueError(f"pooling='pooler': backbone {backbone.name!r} has no pooler "
                             "(RoBERTa has none); use pooling='cls' or 'mean'.")
        train_pooler(backbone)
    features = pool(sequence, inputs["padding_mask"], pooling, pooler)
    logits = classifier_head(features, num_classes, dropout, seed, head=head)
    return tf.keras.Model(inputs=inputs, outputs=logits, name=name)


def _check_choice(name: str, value: str, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r}: choose one of {', '.join(choices)}.")


def train_pooler(backbone: tf.keras.Model) -> None:
    """Makes BERT's `pooled_dense` trainable and tags it `head` (`freeze_non_lora` then leaves
    it trainable)."""
    pooler = backbone.pooled_dense
    pooler.trainable = True
    roles.tag_layer(pooler, roles.HEAD)


def pool(sequence, padding_mask, pooling: str, pooler=None):
    """The sentence features of a last hidden state `sequence` (batch, seq, hidden):

    - "mean": Σ_t m_t h_t / Σ_t m_t with m the padding mask (batch, seq);
    - "cls":  h_0, the first token's state;
    - "pooler": `pooler`(h_0), BERT's tanh(h_0 W + b).

    Example:

    >>> h = tf.constant([[[1.0, 2.0], [3.0, 4.0], [9.0, 9.0]]])
    >>> pool(h, tf.constant([[1, 1, 0]]), "mean").numpy().tolist()
    [[2.0, 3.0]]
    >>> pool(h, tf.constant([[1, 1, 0]]), "cls").numpy().tolist()
    [[1.0, 2.0]]
    """
    _check_choice("pooling", pooling, POOLINGS)
    if pooling == "mean":
        mask = tf.cast(padding_mask, "bool")
        return tf.keras.layers.GlobalAveragePooling1D(name="mean_pooling")(sequence, mask=mask)
    first = sequence[:, 0, :]
    if pooling == "cls":
        return first
    if pooler is None:
        raise ValueError("pooling='pooler' needs the backbone's pooler layer.")
    return pooler(first)


def _head_dense(units: int, seed: int, name: str, activation=None) -> tf.keras.layers.Dense:
    return tf.keras.layers.Dense(
        units, activation=activation,
        kernel_initializer=tf.keras.initializers.TruncatedNormal(stddev=0.02, seed=seed),
        name=name)


def classifier_head(features, num_classes: int, dropout: float = 0.0, seed: int = 0,
                    head: str = "linear"):
    """The head of `build_classifier`, every weight tagged `head` (kernels TruncatedNormal(0.02,
    seed), zero biases):

    - "linear":     logits = Dense(num_classes)(Dropout(features));
    - "dense_tanh": logits = Dense(num_classes)(Dropout(tanh(Dense(hidden)(Dropout(features)))))
      (RoBERTa's classification head: `head_dense`, then `head` as its out_proj).

    Example:

    >>> features = tf.keras.Input(shape=(8,))
    >>> classifier_head(features, num_classes=3).shape
    TensorShape([None, 3])
    >>> classifier_head(features, num_classes=3, head="dense_tanh").shape
    TensorShape([None, 3])
    """
    _check_choice("head", head, HEADS)
    features = tf.keras.layers.Dropout(dropout, seed=seed, name="head_dropout")(features)
    if head == "dense_tanh":
        dense = _head_dense(int(features.shape[-1]), seed + 1, "head_dense", activation="tanh")
        features = dense(features)
        roles.tag_layer(dense, roles.HEAD)
        features = tf.keras.layers.Dropout(dropout, seed=seed + 1,
                                           name="head_dense_dropout")(features)
    out = _head_dense(num_classes, seed, "head")
    logits = out(features)
    roles.tag_layer(out, roles.HEAD)
    return logits


def dummy_batch(backbone: tf.keras.Model, batch_size: int = 2, seq_len: int = 8, seed: int = 0):
    """A random input dict for `backbone` (token ids in [1, vocabulary_size), full padding mask).

    Example:

    >>> sorted(dummy_batch(build_bert_backbone(vocabulary_size=100)))
    ['padding_mask', 'segment_ids', 'token_ids']
    """
    gen = tf.random.Generator.from_seed(seed)
    batch = {
        "token_ids": gen.uniform(
            (batch_size, seq_len), 1, backbone.vocabulary_size, dtype=tf.int32
        ),
        "padding_mask": tf.ones((batch_size, seq_len), tf.int32),
    }
    if "segment_ids" in backbone.input:
        batch["segment_ids"] = tf.zeros((batch_size, seq_len), tf.int32)
    return batch
