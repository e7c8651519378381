"""Tests for tasks.text: hand-computed ids, segments, truncation, padding; real SST-2 batch."""

import collections
import re
import sys

import numpy as np
import pytest

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "movie", "the", "##s", "plot"]


@pytest.fixture(scope="module")
def text(tf_text):
    from tasks import text

    return text


def _arr(*texts):
    return np.array(texts, dtype=object)


def test_single_segment_ids_and_padding(text):
    packer = text.bert_packer(VOCAB, sequence_length=7)
    out = text.tokenize((_arr("Good movie", "the plots", "awful"),), packer)
    assert set(out) == {"token_ids", "segment_ids", "padding_mask"}
    # lower-cased; "plots" -> plot ##s; "awful" -> [UNK].
    np.testing.assert_array_equal(out["token_ids"], [
        [2, 5, 7, 3, 0, 0, 0],
        [2, 8, 10, 9, 3, 0, 0],
        [2, 1, 3, 0, 0, 0, 0],
    ])
    np.testing.assert_array_equal(out["padding_mask"], (out["token_ids"] != 0).astype(np.int32))
    np.testing.assert_array_equal(out["segment_ids"], np.zeros((3, 7)))
    for v in out.values():
        assert v.dtype == np.int32 and v.shape == (3, 7)
    # An OrderedDict of sorted keys: the form TFF serializes a dataset's named elements in, so
    # a ClientData built on it runs in a federated computation as it is.
    assert isinstance(out, collections.OrderedDict)
    assert list(out) == ["padding_mask", "segment_ids", "token_ids"]


def test_pair_segments_and_round_robin_truncation(text):
    packer = text.bert_packer(VOCAB, sequence_length=8)
    out = text.tokenize((_arr("good movie", "good bad good bad good"), _arr("the plot", "bad")),
                        packer, batch_size=1)
    np.testing.assert_array_equal(out["token_ids"][0], [2, 5, 7, 3, 8, 10, 3, 0])
    np.testing.assert_array_equal(out["segment_ids"][0], [0, 0, 0, 0, 1, 1, 1, 0])
    # 8 - 3 specials = 5 tokens: round robin keeps 4 of the first segment and the 1 of the second.
    np.testing.assert_array_equal(out["token_ids"][1], [2, 5, 6, 5, 6, 3, 6, 3])
    np.testing.assert_array_equal(out["segment_ids"][1], [0, 0, 0, 0, 0, 0, 1, 1])
    np.testing.assert_array_equal(out["padding_mask"][1], np.ones(8))


def test_vocab_file_and_wordpiece_tokenizer(text, tmp_path):
    import keras_nlp

    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    from_file = text.tokenize((_arr("bad movie"),), text.bert_packer(path, 5))
    tok = keras_nlp.tokenizers.WordPieceTokenizer(vocabulary=VOCAB, lowercase=True)
    from_tokenizer = text.tokenize((_arr("bad movie"),), text.BertInputPacker(tok, 5))
    np.testing.assert_array_equal(from_file["token_ids"], [[2, 6, 7, 3, 0]])
    np.testing.assert_array_equal(from_tokenizer["token_ids"], [[2, 6, 7, 3, 0]])
    with pytest.raises(FileNotFoundError, match="missing_vocab.txt"):
        text.bert_packer(tmp_path / "missing_vocab.txt", 5)


def test_keras_nlp_bert_preprocessor_is_accepted(text):
    import keras_nlp

    tok = keras_nlp.models.BertTokenizer(vocabulary=VOCAB, lowercase=True)
    pre = keras_nlp.models.BertPreprocessor(tok, sequence_length=6)
    out = text.tokenize((_arr("good movie"),), pre)
    np.testing.assert_array_equal(out["token_ids"], [[2, 5, 7, 3, 0, 0]])
    np.testing.assert_array_equal(out["padding_mask"], [[1, 1, 1, 1, 0, 0]])
    assert out["padding_mask"].dtype == np.int32


def test_real_sst2_dev_tokenized_batch(text, shared_data):
    from tasks import benchmark_text, client_data, text_files

    data = text_files.load_glue_tsv(shared_data / "sst2", "sst2", splits=("dev",))["dev"]
    vocab = benchmark_text.frequency_vocabulary(data.segments[0], 3000)
    out = text.tokenize(data.segments, text.bert_packer(vocab, 32))
    assert out["token_ids"].shape == (872, 32)
    assert (out["token_ids"][:, 0] == 2).all()  # [CLS]
    lengths = out["padding_mask"].sum(axis=1)
    # Every sentence ends with [SEP] at position length - 1.
    np.testing.assert_array_equal(out["token_ids"][np.arange(872), lengths - 1], 3)
    # BERT's basic tokenizer splits on whitespace and around each punctuation character, and a
    # word WordPiece cannot split with this whole-word vocabulary becomes one [UNK]: one id per
    # basic token.
    words = [len(re.findall(r"[^\W_]+|[^\w\s]|_", s)) for s in data.segments[0]]
    np.testing.assert_array_equal(lengths, np.minimum(words, 30) + 2)
    fn = client_data.preprocess_fn(batch_size=16)
    x, y = next(iter(fn(client_data.tensor_dataset(out, data.labels))))
    for key in ("token_ids", "segment_ids", "padding_mask"):
        assert x[key].shape == (16, 32) and x[key].dtype.name == "int32"
    assert y.shape == (16,)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_trimming_packer_keeps_every_text_whole_at_the_longest_width(text):
    """With `trim`, L is a cap: each text keeps all its tokens ([CLS] w… [SEP]), and the arrays
    are as wide as the longest text, padded with [PAD] = 0 and mask 0 (counted by hand)."""
    packer = text.bert_packer(VOCAB, sequence_length=64, trim=True)
    texts = _arr(*["good movie"] * 3, "bad", "good good good movie")
    out = text.tokenize((texts,), packer, batch_size=4)  # two batches of widths 4 and 6
    assert out["token_ids"].shape == (5, 6)
    assert out["token_ids"][3].tolist() == [2, 6, 3, 0, 0, 0]
    assert out["token_ids"][4].tolist() == [2, 5, 5, 5, 7, 3]
    assert out["padding_mask"].sum(axis=1).tolist() == [4, 4, 4, 3, 6]
    assert not out["segment_ids"].any()
