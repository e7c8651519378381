"""Gemma 3's SentencePiece tokenizer, rebuilt from the vocabulary in a GGUF file's metadata.

A GGUF file of a SentencePiece model (`tokenizer.ggml.model` = "llama") carries the pieces
(`tokenizer.ggml.tokens`), their scores (`.scores`) and types (`.token_type`, numbered as
SentencePiece's: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte) and the
special ids (`.bos_token_id`, `.eos_token_id`, `.unknown_token_id`, `.padding_token_id`).
`sentencepiece_proto(vocabulary)` writes them back as a SentencePiece `ModelProto`, as
Gemma's own `tokenizer.model` is set up:

* BPE with byte fallback: a character outside the vocabulary becomes its UTF-8 bytes, the
  pieces `<0x00>`..`<0xFF>`; merges follow the piece scores;
* a normalizer that only escapes spaces to "▁" (U+2581): no Unicode normalization, no dummy
  prefix (`tokenizer.ggml.add_space_prefix` = false: "The" is `The`, not `▁The`), extra
  whitespace kept; newlines and tabs are pieces of their own (user-defined);
* the piece at `unknown_token_id` typed UNKNOWN (llama.cpp's conversion stores Gemma's `<unk>`
  as a control token; SentencePiece needs exactly one unknown piece).

`gemma3_tokenizer(path)` is a `keras_nlp.tokenizers.SentencePieceTokenizer` on that proto
(tensorflow-text's op). It adds no BOS: callers prepend `GEMMA3_BOS` (= 2) themselves, as
Gemma's `tokenizer.ggml.add_bos_token` asks; generation stops at `GEMMA3_EOS` (= 1) or, for the
instruction-tuned chat format, `GEMMA3_END_OF_TURN` (= 106). These constants are Gemma 3 270M's
ids; `read_gguf_vocabulary` reads a file's own.

Example (a toy vocabulary; real use: `gemma3_tokenizer(fetch_gemma3_270m())`):

>>> byte_pieces = [f"<0x{b:02X}>" for b in range(256)]
>>> vocabulary = GGUFVocabulary(
...     pieces=["<pad>", "<eos>", "<bos>", "<unk>", "\\n", *byte_pieces, "▁", "a", "b", "▁a", "ab"],
...     scores=[0.0] * 5 + [0.0] * 256 + [-1.0, -2.0, -3.0, -4.0, -5.0],
...     types=[3, 3, 3, 3, 4] + [6] * 256 + [1] * 5,
...     bos_id=2, eos_id=1, unknown_id=3, padding_id=0)
>>> tokenizer = tokenizer_from_vocabulary(vocabulary)
>>> ids = tokenizer("ab a\\né").numpy().tolist()
>>> [vocabulary.pieces[i] for i in ids]
['ab', '▁a', '\\n', '<0xC3>', '<0xA9>']
>>> tokenizer.detokenize(ids).numpy().decode()
'ab a\\né'
"""

from __future__ import annotations

import dataclasses

import keras_nlp

from models.gguf_reader import metadata_value, open_reader

# Gemma 3 270M's special ids (tests/models/test_gemma3.py checks them against the GGUF file).
GEMMA3_PAD = 0
GEMMA3_EOS = 1
GEMMA3_BOS = 2
GEMMA3_END_OF_TURN = 106

_UNKNOWN_TYPE = 2
_GGUF_TYPES = {1: "NORMAL", 2: "UNKNOWN", 3: "CONTROL", 4: "USER_DEFINED", 5: "UNUSED",
               6: "BYTE"}


@dataclasses.dataclass(frozen=True)
class GGUFVocabulary:
    """A SentencePiece vocabulary as a GGUF file stores it: piece i, its score and GGUF type."""

    pieces: list[str]
    scores: list[float]
    types: list[int]
    bos_id: int
    eos_id: int
    unknown_id: int
    padding_id: int | None = None

    def token_id(self, piece: str) -> int | None:
        """The id of `piece`, or None when the vocabulary lacks it."""
        try:
            return self.pieces.index(piece)
        except ValueError:
            return None


def read_gguf_vocabulary(path_or_reader) -> GGUFVocabulary:
    """The tokenizer vocabulary of a GGUF file (a path or an open `gguf.GGUFReader`).

    Raises:
      ValueError: the file's tokenizer is not a SentencePiece one ("llama"), or a key is missing.
    """

    reader = open_reader(path_or_reader)
    model = metadata_value(reader, "tokenizer.ggml.model")
    if model != "llama":
        raise ValueError(f"GGUF tokenizer model is {model!r}; only SentencePiece ('llama') is "
                         "supported")
    padding = reader.fields.get("tokenizer.ggml.padding_token_id")
    return GGUFVocabulary(
        pieces=list(metadata_value(reader, "tokenizer.ggml.tokens")),
        scores=[float(s) for s in metadata_value(reader, "tokenizer.ggml.scores")],
        types=[int(t) for t in metadata_value(reader, "tokenizer.ggml.token_type")],
        bos_id=int(metadata_value(reader, "tokenizer.ggml.bos_token_id")),
        eos_id=int(metadata_value(reader, "tokenizer.ggml.eos_token_id")),
        unknown_id=int(metadata_value(reader, "tokenizer.ggml.unknown_token_id")),
        padding_id=None if padding is None else int(padding.contents()))


def sentencepiece_proto(vocabulary: GGUFVocabulary) -> bytes:
    """The serialized SentencePiece `ModelProto` of `vocabulary` (module doc)."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    sizes = {len(vocabulary.pieces), len(vocabulary.scores), len(vocabulary.types)}
    if len(sizes) != 1:
        raise ValueError(f"GGUF vocabulary lists differ in length: {sorted(sizes)}")
    proto = pb.ModelProto()
    piece_type = pb.ModelProto.SentencePiece.Type
    for i, (piece, score, gguf_type) in enumerate(
            zip(vocabulary.pieces, vocabulary.scores, vocabulary.types)):
        if gguf_type not in _GGUF_TYPES:
            raise ValueError(f"GGUF token {i} ({piece!r}) has unknown token type {gguf_type}")
        kind = _GGUF_TYPES[_UNKNOWN_TYPE if i == vocabulary.unknown_id else gguf_type]
        if kind == "UNKNOWN" and i != vocabulary.unknown_id:
            kind = "CONTROL"
        proto.pieces.add(piece=piece, score=score, type=piece_type.Value(kind))
    spec = proto.trainer_spec
    spec.model_type = pb.TrainerSpec.BPE
    spec.vocab_size = len(vocabulary.pieces)
    spec.byte_fallback = True
    spec.split_digits = True
    spec.allow_whitespace_only_pieces = True
    spec.unk_id, spec.bos_id, spec.eos_id = (vocabulary.unknown_id, vocabulary.bos_id,
                                             vocabulary.eos_id)
    spec.pad_id = -1 if vocabulary.padding_id is None else vocabulary.padding_id
    spec.unk_piece = vocabulary.pieces[vocabulary.unknown_id]
    spec.bos_piece = vocabulary.pieces[vocabulary.bos_id]
    spec.eos_piece = vocabulary.pieces[vocabulary.eos_id]
    if vocabulary.padding_id is not None:
        spec.pad_piece = vocabulary.pieces[vocabulary.padding_id]
    normalizer = proto.normalizer_spec
    normalizer.name = "identity"
    normalizer.add_dummy_prefix = False
    normalizer.remove_extra_whitespaces = False
    normalizer.escape_whitespaces = True
    return proto.SerializeToString()


def tokenizer_from_vocabulary(vocabulary: GGUFVocabulary, **kwargs
                              ) -> keras_nlp.tokenizers.SentencePieceTokenizer:
    """A KerasNLP `SentencePieceTokenizer` on `sentencepiece_proto(vocabulary)` (no BOS added);
    `kwargs` go to its constructor (e.g. `sequence_length`)."""
    return keras_nlp.tokenizers.SentencePieceTokenizer(
        proto=sentencepiece_proto(vocabulary), **kwargs)


def gemma3_tokenizer(path_or_reader, **kwargs) -> keras_nlp.tokenizers.SentencePieceTokenizer:
    """The tokenizer of a GGUF file (path or `gguf.GGUFReader`); prepend the BOS id yourself.

    Example (downloads Gemma 3 270M once):

    >>> from models.gguf_checkpoint import fetch_gemma3_270m
    >>> tokenizer = gemma3_tokenizer(fetch_gemma3_270m())  # doctest: +SKIP
    >>> [GEMMA3_BOS] + tokenizer("The capital of France is").numpy().tolist()  # doctest: +SKIP
    [2, 818, 5279, 529, 7001, 563]
    """
    return tokenizer_from_vocabulary(read_gguf_vocabulary(path_or_reader), **kwargs)
