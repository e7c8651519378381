"""Tests for tasks.glue_tfds with tfds.testing.mock_data (offline, same code path as real TFDS)."""

import sys

import numpy as np
import pytest

from tasks import glue_tfds

SPLITS = {"sst2": "validation", "qnli": "validation", "mnli": "validation_matched",
          "qqp": "validation", "rte": "validation"}
CLASSES = {"sst2": 2, "qnli": 2, "mnli": 3, "qqp": 2, "rte": 2}


@pytest.mark.parametrize("task", sorted(SPLITS))
def test_load_glue_tfds_mock(tfds, task):
    with tfds.testing.mock_data(num_examples=9):
        ex = glue_tfds.load_glue_tfds(task, SPLITS[task])
    assert len(ex) == 9
    assert ex.columns == glue_tfds.GLUE_TFDS_FEATURES[task]
    assert len(ex.segments) == (1 if task == "sst2" else 2)
    assert all(isinstance(s, str) for seg in ex.segments for s in seg)
    assert ex.labels.dtype == np.int32
    assert set(ex.labels) <= set(range(CLASSES[task]))


def test_unknown_task():
    with pytest.raises(ValueError, match="unknown GLUE task 'wnli'"):
        glue_tfds.load_glue_tfds("wnli")


def test_glue_tfds_task_mock_tokenized(tfds, tf_text):
    from tasks import task as task_lib
    from tasks import text

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list("abcdefghij")
    with tfds.testing.mock_data(num_examples=40):
        t = task_lib.glue_tfds_task("mnli", text.bert_packer(vocab, 12),
                                    task_lib.Partitioning(0, num_clients=4, scheme="iid"))
    assert t.num_classes == 3 and len(t.train_data.client_ids) == 4
    assert sum(t.info["train_sizes"].values()) == 40
    assert int(t.global_test_data.cardinality()) == 40
    x, _ = next(iter(t.train_data.create_tf_dataset_for_client("client_000").batch(10)))
    assert x["token_ids"].shape == (10, 12)
    seg = x["segment_ids"].numpy()
    assert (seg.max(axis=1) == 1).all()  # premise and hypothesis both present


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
