"""scripts/export_adapters.py: a run folder -> a PEFT adapter folder (+ the tiny run's HF base)
that rebuilds the trained classifier exactly (its dev loss is the run's recorded eval_loss)."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from scripts import export_adapters

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_run_options_take_the_recorded_flags_over_the_defaults():
    options = export_adapters.run_options(
        {"task": "sst2", "rank": 4, "lora_targets": ["value"], "algorithm": "fedavg",
         "backbone": "tiny", "lora_alpha": None}, data_dir="d", frozen_dir=None)
    assert (options["task"], options["rank"], options["lora_targets"]) == ("sst2", 4, ["value"])
    assert options["data_dir"] == "d" and options["client_ranks"] is None
    assert options["lora_alpha"] is None  # a recorded None keeps the default


def _script(name, *args):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *args],
                          capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))


@pytest.mark.slow
def test_export_of_a_tiny_sst2_run_rebuilds_its_classifier(tmp_path, shared_data):
    from models import backbones, checkpoints, hf_bert, peft_export
    from models.lora_targets import LoraConfig, apply_lora
    from tasks import text as text_lib

    try:
        vocab = checkpoints.fetch_minilm() / "vocab.txt"
    except Exception as e:
        pytest.skip(f"all-MiniLM-L6-v2 vocabulary unavailable: {e}")
    run, out = tmp_path / "run", tmp_path / "adapters"
    proc = _script("train.py", "--task=sst2", "--backbone=tiny", "--algorithm=fedavg",
                   "--rounds=1", "--num_clients=2", "--clients_per_round=2", "--local_steps=1",
                   "--batch_size=4", "--sequence_length=16", f"--data_dir={shared_data}",
                   f"--output_dir={run}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = _script("export_adapters.py", f"--run_dir={run}", f"--output_dir={out}",
                   f"--data_dir={shared_data}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    config = json.loads((out / "adapter_config.json").read_text())
    head = json.loads((out / "tffl_head.json").read_text())
    assert config["base_model_name_or_path"] == "base" and (out / "base" / "vocab.txt").is_file()

    backbone, _ = hf_bert.load_hf_bert(out / "base")
    apply_lora(backbone, LoraConfig(rank=config["r"], alpha=config["lora_alpha"],
                                    targets=("query", "value")))
    model = backbones.build_classifier(backbone, head["num_labels"], pooling=head["pooling"],
                                       head=head["head"])
    peft_export.import_peft(model, out)
    lines = (shared_data / "sst2" / "dev.tsv").read_text().splitlines()[1:]
    texts = [line.rsplit("\t", 1)[0] for line in lines]
    labels = np.array([int(line.rsplit("\t", 1)[1]) for line in lines])
    logits = model(text_lib.bert_packer(vocab, 16)(tf.constant(texts))).numpy()
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)
    summary = json.loads((run / "summary.json").read_text())
    assert float(loss) == pytest.approx(summary["final"]["eval_loss"], rel=1e-5, abs=1e-6)
