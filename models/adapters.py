"""Whole-model LoRA utilities: merge / unmerge and parameter counts.

Adapters leave a run in Hugging Face PEFT's format (`models.peft_export`); this module works on
the model in memory.
"""

import tensorflow as tf

from models.lora_targets import lora_layers


def merge_lora(model: tf.keras.Model) -> int:
    """Folds every adapter into its frozen kernel (W0 ← W0 + (α/r)·A·B); returns the count.

    Example:

    >>> from models.backbones import build_bert_backbone
    >>> from models.lora_targets import LoraConfig, apply_lora
    >>> backbone = build_bert_backbone(vocabulary_size=50)
    >>> _ = apply_lora(backbone, LoraConfig(rank=2))   # query and value of both layers
    >>> merge_lora(backbone)
    4
    """
    layers = lora_layers(model)
    for layer in layers:
        layer.merge()
    return len(layers)


def unmerge_lora(model: tf.keras.Model) -> int:
    """Undoes `merge_lora` (W0 ← W0 − (α/r)·A·B); returns the number of adapters."""
    layers = lora_layers(model)
    for layer in layers:
        layer.unmerge()
    return len(layers)


def lora_parameter_count(model: tf.keras.Model) -> int:
    """Σ over adapters of r·(d_in + d_out).

    Example:

    >>> from models.backbones import build_bert_backbone
    >>> from models.lora_targets import LoraConfig, apply_lora
    >>> backbone = build_bert_backbone(vocabulary_size=50, hidden_dim=32)
    >>> _ = apply_lora(backbone, LoraConfig(rank=2, targets=("value",), layers=(0,)))
    >>> lora_parameter_count(backbone)  # 2 * (32 + 32)
    128
    """
    return sum(layer.rank * (layer.d_in + layer.d_out) for layer in lora_layers(model))
