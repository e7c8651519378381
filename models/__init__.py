"""Keras models for tffl: LoRA layers, LoRA on KerasNLP backbones, heads, checkpoint conversion.

See docs/models.md.
"""
