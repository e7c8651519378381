"""benchmarks/peer.py, tffl beside Transformers + PEFT: without a Python that has the peer's
libraries the part says how to make one and is skipped, and the batches the peer trains on are
the examples tffl trained on, in its order. (The side-by-side itself is a measurement, not a
test: docs/PERFORMANCE.md.)"""

import importlib.util
import json
import sys

import numpy as np
import pytest

from benchmarks import peer, peft_loop, targets
from benchmarks.config import PEER_MODELS, TargetsConfig


def test_without_a_peer_python_the_part_says_how_to_make_one_and_is_skipped(tmp_path):
    logged = []
    assert peer.run_peer(TargetsConfig(), tmp_path, logged.append) == {
        "skipped": "no --peer_python was given"}
    (line,) = logged
    assert peer.PEER_SETUP in line and "--peer_python=/tmp/hf/bin/python" in line
    assert not any(tmp_path.iterdir())   # nothing was run
    # The suite with the peer part alone: benchmark.json says it was skipped, with no ratio.
    result = targets.run_targets(TargetsConfig(parts=("peer",)), tmp_path, log=lambda _: None)
    written = json.loads((tmp_path / "benchmark.json").read_text())
    assert written["peer"] == result["peer"] == {"skipped": "no --peer_python was given"}
    assert "peer_seconds_ratio" not in written and "peer" not in (tmp_path / "benchmark.md"
                                                                  ).read_text()


def test_every_model_of_the_flag_has_a_protocol(tmp_path):
    assert sorted(peer.PEER_SETTINGS) == sorted(PEER_MODELS)
    with pytest.raises(ValueError, match="peer_models=minilm,gemma: unknown gemma; choose from "
                                         "minilm, gemma3_270m"):
        peer.run_peer(TargetsConfig(peer_models=("minilm", "gemma")), tmp_path, print)


def test_a_python_that_cannot_run_the_peer_is_named(tmp_path):
    missing = tmp_path / "python"
    assert peer.peer_python_problem(str(missing)) == f"--peer_python={missing} does not exist"
    if all(importlib.util.find_spec(m) for m in ("peft", "torch", "transformers")):
        pytest.skip("this Python has torch, transformers and peft")
    problem = peer.peer_python_problem(sys.executable)   # tffl's environment: none of them
    assert problem.startswith(f"--peer_python={sys.executable} cannot import torch, "
                              "transformers and peft: ") and "No module named" in problem


@pytest.mark.large
@pytest.mark.parametrize("model, test_backbone", [("minilm", "tiny"), ("gemma3_270m", "gpt2_tiny")])
def test_the_peer_trains_on_the_examples_tffl_trained_on(model, test_backbone, tmp_path,
                                                         sample_data):
    """The batches written for the peer (the task built without the cached prefix) hold, round
    by round and client by client, the examples of tffl's batches (with the cached prefix where
    the task has one, the default): the same targets and the same token counts in the same
    order, the protocol's K batches of B each; a decoder's carry its answer tokens' mask. On the
    test backbones of the same task (a tiny BERT, a tiny GPT-2), LoRA on their layer 1."""
    from models import checkpoints
    from runner import training

    try:
        checkpoints.fetch_minilm()  # its vocabulary tokenizes the sentences for the tiny BERT
    except Exception as e:
        pytest.skip(f"all-MiniLM-L6-v2 vocabulary unavailable: {e}")
    setting = peer.PEER_SETTINGS[model]
    run_config = peer.peer_run_config(TargetsConfig(data_dir=str(sample_data)), model, 3,
                                      tmp_path / "tffl").with_changes(backbone=test_backbone,
                                                                      lora_layers=(1,))
    clients, steps = peer.export_batches(run_config, tmp_path / "batches.npz")
    assert (clients, steps) == (3, setting.local_steps)
    arrays = dict(np.load(tmp_path / "batches.npz"))
    task = training.run_task_for(peer.PEER_ALGORITHM, run_config)
    assert (task.prefix_cache is not None) == (model == "minilm")
    for round_num in range(1, peer.PEER_ROUNDS + 1):
        for index, cid in enumerate(task.client_ids):
            written = peft_loop.batches_of(arrays, round_num, index)
            trained = list(task.client_dataset_fn(cid, round_num).as_numpy_iterator())
            assert len(written) == len(trained) == steps
            for batch, (features, labels) in zip(written, trained):
                assert len(batch["token_ids"]) == setting.batch_size
                np.testing.assert_array_equal(batch["labels"], labels)
                np.testing.assert_array_equal(batch["padding_mask"].sum(axis=1),
                                              features["padding_mask"].sum(axis=1))
                assert batch["token_ids"].shape == batch["padding_mask"].shape
                if model == "gemma3_270m":
                    np.testing.assert_array_equal(batch["response_mask"],
                                                  features["response_mask"])
