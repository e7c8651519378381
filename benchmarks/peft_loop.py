r"""The peer of `--targets_parts=peer` (benchmarks/peer.py): a Hugging Face Transformers + PEFT
FedAvg loop over the batches a tffl run trained on, run in a Python that has torch,
transformers and peft (tffl's environment has none of them). Of tffl it imports only
`tffl.simulation.memory`, which needs nothing but the standard library.

It is what FlowerTune's recipe does without the transport: each round, every client starts from
the global trained weights, takes one SGD step per batch of its round, and the server sets the
global weights to the clients' mean weighted by their examples,

    θ_{t+1} = Σ_i n_i θ_i / Σ_i n_i,    θ_i = θ_t − η Σ_k ∇ℓ(θ; batch_{i,k}) (one step per batch).

The models are those tffl trains, float32, eager attention, `peft`'s LoRA of rank r, α = r, on the
attention's query and value projections of the given layers:

- family "bert": the checkpoint's `BertModel`, the sentence mean of the last hidden states over
  the padding mask and a linear head (trained too); ℓ is the cross-entropy of the labels;
- family "gemma3": `Gemma3ForCausalLM`; ℓ is the mean cross-entropy of the answer tokens (the
  batch's `response_mask`), as `labels` with −100 elsewhere, the usual way (Transformers
  computes the logits of every position).

Usage (the work folder is what benchmarks/peer.py writes: `setting.json` and `batches.npz`):

    /path/to/torch/python benchmarks/peft_loop.py WORK_DIR

It writes `WORK_DIR/peft.json`: per round its wall seconds and mean training loss, the client
steps per round, the process's peak resident memory (`peak_rss_mb`, `VmHWM` in MB of 10^6 bytes,
as tffl's metrics.csv columns), its peak once torch, transformers and peft are imported
(`libraries_rss_mb`: PyPI's torch for Linux is the CUDA build, whose libraries are resident even
on a CPU) and the library versions.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

import numpy as np

# tffl's own reader of a process's peak memory (standard library only; no TensorFlow here), so
# that both sides of the benchmark are measured alike: VmHWM, in MB of 10^6 bytes.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from tffl.simulation.memory import peak_rss_mb  # noqa: E402


def batches_of(arrays, round_num: int, client: int) -> list[dict]:
    """The batches (feature name -> array, `labels` among them) of `client` (its index) in
    `round_num`, in the order tffl trained them."""
    out, step = [], 0
    while f"r{round_num}_c{client}_s{step}_labels" in arrays:
        prefix = f"r{round_num}_c{client}_s{step}_"
        out.append({k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)})
        step += 1
    return out


def _model(setting: dict):
    """`(model, head, loss(batch))`: the family's model with LoRA, its head (None for a
    decoder) and its batch loss."""
    import peft
    import torch
    import transformers

    def ids(batch, key):
        return torch.from_numpy(batch[key].astype(np.int64))

    if setting["family"] == "bert":
        model = transformers.BertModel.from_pretrained(setting["checkpoint"],
                                                       attn_implementation="eager")
        targets, pattern = ["query", "value"], "layer"
    else:
        model = transformers.Gemma3ForCausalLM.from_pretrained(
            setting["checkpoint"], attn_implementation="eager", dtype=torch.float32)
        targets, pattern = ["q_proj", "v_proj"], "layers"
    lora = peft.LoraConfig(r=setting["rank"], lora_alpha=setting["rank"], lora_dropout=0.0,
                           target_modules=targets, layers_to_transform=list(setting["layers"]),
                           layers_pattern=pattern)
    model = peft.get_peft_model(model, lora)
    if setting["family"] != "bert":
        def decoder_loss(batch):
            labels = ids(batch, "token_ids").masked_fill(ids(batch, "response_mask") == 0, -100)
            return model(input_ids=ids(batch, "token_ids"),
                         attention_mask=ids(batch, "padding_mask"), labels=labels).loss

        return model, None, decoder_loss
    head = torch.nn.Linear(model.config.hidden_size, setting["num_classes"])

    def classifier_loss(batch):
        mask = ids(batch, "padding_mask")
        hidden = model(input_ids=ids(batch, "token_ids"), attention_mask=mask,
                       token_type_ids=ids(batch, "segment_ids")).last_hidden_state
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        return torch.nn.functional.cross_entropy(head(pooled), ids(batch, "labels"))

    return model, head, classifier_loss


def main(argv: list[str]) -> int:
    import peft
    import torch
    import transformers

    libraries_mb = peak_rss_mb()   # the peak so far: right after these imports
    work = pathlib.Path(argv[1])
    setting = json.loads((work / "setting.json").read_text())
    arrays = dict(np.load(work / "batches.npz"))
    torch.manual_seed(setting["seed"])
    torch.set_num_threads(setting["threads"])
    model, head, loss_of = _model(setting)
    params = [p for p in model.parameters() if p.requires_grad]
    params += list(head.parameters()) if head is not None else []
    global_state = [p.detach().clone() for p in params]
    rounds = []
    for round_num in range(1, setting["rounds"] + 1):
        start, losses = time.perf_counter(), []
        sums, total = [torch.zeros_like(p) for p in params], 0
        for client in range(setting["clients"]):
            with torch.no_grad():
                for p, g in zip(params, global_state):
                    p.copy_(g)
            optimizer = torch.optim.SGD(params, lr=setting["learning_rate"])
            examples = 0
            for batch in batches_of(arrays, round_num, client):
                loss = loss_of(batch)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(float(loss.detach()))
                examples += len(batch["token_ids"])
            with torch.no_grad():
                for s, p in zip(sums, params):
                    s.add_(p, alpha=examples)
            total += examples
        global_state = [s / total for s in sums]
        rounds.append({"seconds": time.perf_counter() - start,
                       "loss": float(np.mean(losses))})
        print(f"peft round {round_num}: {rounds[-1]['seconds']:.2f} s, loss "
              f"{rounds[-1]['loss']:.4f}", flush=True)
    result = {"rounds": rounds, "client_steps_per_round": setting["clients"] * setting["steps"],
              "peak_rss_mb": peak_rss_mb(),
              "libraries_rss_mb": libraries_mb,
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "peft": peft.__version__}}
    (work / "peft.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
