"""KerasNLP BERT/RoBERTa backbones with small defaults, and a sequence-classification head.

`build_classifier(backbone, num_classes)` returns a functional `tf.keras.Model` taking the
backbone's input dict and returning logits (batch, num_classes):

    logits = drop(pooled) · W_head + b_head

where `pooled` is BERT's `pooled_output` (tanh(Dense(h_[CLS]))) or, for backbones without a
pooler (RoBERTa), the first token's sequence output h_<s>. W_head, b_head carry the `head` role.
"""

import keras_nlp
import tensorflow as tf

from tffl import roles


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
) -> tf.keras.Model:
    """Backbone → pooled/first-token features → Dropout → Dense(num_classes) logits.

    The backbone object is reused (not copied), so LoRA applied to it before or after this call
    is part of the classifier. The head's kernel and bias are tagged `head`.

    Example:

    >>> model = build_classifier(build_bert_backbone(vocabulary_size=100), num_classes=3)
    >>> batch = {"token_ids": tf.ones((2, 6), tf.int32), "segment_ids": tf.zeros((2, 6), tf.int32),
    ...          "padding_mask": tf.ones((2, 6), tf.int32)}
    >>> model(batch).shape
    TensorShape([2, 3])
    """
    if num_classes <= 0:
        raise ValueError(f"num_classes must be positive, got num_classes={num_classes!r}.")
    inputs = {k: tf.keras.Input(shape=(None,), dtype="int32", name=k) for k in backbone.input}
    outputs = backbone(inputs)
    if isinstance(outputs, dict):
        features = outputs["pooled_output"]
    else:
        features = outputs[:, 0, :]
    logits = classifier_head(features, num_classes, dropout, seed)
    return tf.keras.Model(inputs=inputs, outputs=logits, name=name)


def classifier_head(features, num_classes: int, dropout: float = 0.0, seed: int = 0):
    """`Dense(num_classes)(Dropout(dropout)(features))`, the head of `build_classifier`: kernel
    TruncatedNormal(0.02, seed) and zero bias, both tagged `head`.

    Example:

    >>> features = tf.keras.Input(shape=(8,))
    >>> classifier_head(features, num_classes=3).shape
    TensorShape([None, 3])
    """
    features = tf.keras.layers.Dropout(dropout, seed=seed, name="head_dropout")(features)
    head = tf.keras.layers.Dense(
        num_classes,
        kernel_initializer=tf.keras.initializers.TruncatedNormal(stddev=0.02, seed=seed),
        name="head",
    )
    logits = head(features)
    roles.tag_layer(head, roles.HEAD)
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
