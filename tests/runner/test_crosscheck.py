"""runner/crosscheck.py: the tffl side of PEFT's cross-check (scripts/peft_crosscheck.py's first
step) writes the exported classifier's own logits, rebuilt from the folder and its base alone.
(The Gemma 3 side's checkpoint in HF's names: tests/models/test_gemma3.py.)"""

import json
import re

import numpy as np
import tensorflow as tf

from models import backbones
from models import hf_weights
from models import peft_export
from models.lora_targets import LoraConfig, apply_lora, lora_layers
from runner import crosscheck
from tasks import text

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _vocabulary() -> list[str]:
    """A WordPiece vocabulary in which every word of the check's sentences is one token."""
    words = {w for s in crosscheck.SENTENCES for w in re.findall(r"\w+|[^\w\s]", s.lower())}
    return SPECIAL + sorted(words)


def test_the_reference_of_an_encoder_folder_is_the_exported_classifier(tmp_path):
    # A fixed draw of the random backbone and head: unseeded, the adapters' largest effect on the
    # logits ranged over 7.6e-5 to 1.1e-3 between runs, sometimes under the check below.
    tf.keras.utils.set_random_seed(0)
    vocabulary = _vocabulary()
    backbone = backbones.build_bert_backbone(vocabulary_size=len(vocabulary), num_layers=2,
                                             num_heads=2, hidden_dim=8, intermediate_dim=16,
                                             max_sequence_length=crosscheck.SEQUENCE_LENGTH)
    apply_lora(backbone, LoraConfig(rank=2, targets=("query", "value"), layers=(1,)))
    rng = np.random.default_rng(0)
    for wrapper in lora_layers(backbone):   # adapters that move the logits
        wrapper.lora_b.assign(rng.normal(0.0, 0.5, wrapper.lora_b.shape).astype(np.float32))
    model = backbones.build_classifier(backbone, num_classes=3, pooling="mean")
    folder = tmp_path / "adapters"
    peft_export.export_peft(model, folder, base_model_name_or_path=str(folder / "base"))
    hf_weights.save_base(model, folder / "base")
    (folder / "base" / "vocab.txt").write_text("\n".join(vocabulary) + "\n")

    line = crosscheck.write_reference(folder, tmp_path / "work")
    assert "5 sentences (mean pooling, linear head" in line
    ours = np.load(tmp_path / "work" / crosscheck.LOGITS_FILE)
    assert json.loads(str(ours["texts"])) == crosscheck.SENTENCES
    x = text.bert_packer(folder / "base" / "vocab.txt", crosscheck.SEQUENCE_LENGTH)(
        tf.constant(crosscheck.SENTENCES))
    np.testing.assert_array_equal(ours["token_ids"], x["token_ids"].numpy())
    assert (ours["token_ids"] != 1).all()   # no [UNK]: every word is in the vocabulary
    np.testing.assert_allclose(ours["logits"], model(x).numpy(), rtol=0, atol=1e-5)
    assert np.abs(ours["logits"] - ours["without_adapters"]).max() > 1e-4   # they arrived
    assert str(ours["base"]) == str(folder / "base")
