r"""The peer of `--targets_parts=peer` (benchmarks/peer.py): a Hugging Face Transformers + PEFT
FedAvg loop over the batches a tffl run trained on, run in a Python that has torch,
transformers and peft (it imports nothing of tffl, and tffl's environment has none of them).

It is what FlowerTune's recipe does without the transport: each round, every client starts from
the global LoRA factors and head, takes one SGD step per batch of its round, and the server sets
the global factors and head to the clients' mean weighted by their examples,

    θ_{t+1} = Σ_i n_i θ_i / Σ_i n_i,    θ_i = θ_t − η Σ_k ∇ℓ(θ; batch_{i,k}) (one step per batch).

The model is the checkpoint's `BertModel` (float32, eager attention) with `peft`'s LoRA of rank r,
α = r, on the attention's query and value of the given layers, the sentence mean of the last
hidden states over the padding mask, and a linear head: the model tffl trains.

Usage (the work folder is what benchmarks/peer.py writes: `setting.json` and `batches.npz`):

    /path/to/torch/python benchmarks/peft_loop.py WORK_DIR

It writes `WORK_DIR/peft.json`: per round its wall seconds and mean training loss, the client
steps per round, the process's peak resident memory (MB, `VmHWM`), its resident memory once
torch, transformers and peft are imported (`libraries_rss_mb`: PyPI's torch for Linux is the CUDA
build, whose libraries are resident even on a CPU) and the library versions.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

import numpy as np


def batches_of(arrays, round_num: int, client: int) -> list[dict]:
    """The batches `(token_ids, padding_mask, segment_ids, labels)` of `client` (its index) in
    `round_num`, in the order tffl trained them."""
    out, step = [], 0
    while f"r{round_num}_c{client}_s{step}_token_ids" in arrays:
        prefix = f"r{round_num}_c{client}_s{step}_"
        out.append({k: arrays[prefix + k]
                    for k in ("token_ids", "padding_mask", "segment_ids", "labels")})
        step += 1
    return out


def resident_mb(field: str = "VmRSS") -> float:
    """This process's resident memory (MB) from /proc/self/status: now (`VmRSS`) or its peak
    since this program started (`VmHWM`, the kernel's high-water mark; unlike `getrusage`'s,
    it does not carry over the memory of the process this one was forked from)."""
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str]) -> int:
    import peft
    import torch
    import transformers

    libraries_mb = resident_mb()

    work = pathlib.Path(argv[1])
    setting = json.loads((work / "setting.json").read_text())
    arrays = dict(np.load(work / "batches.npz"))
    torch.manual_seed(setting["seed"])
    torch.set_num_threads(setting["threads"])
    model = transformers.BertModel.from_pretrained(setting["checkpoint"],
                                                   attn_implementation="eager")
    lora = peft.LoraConfig(r=setting["rank"], lora_alpha=setting["rank"], lora_dropout=0.0,
                           target_modules=list(setting["targets"]),
                           layers_to_transform=list(setting["layers"]), layers_pattern="layer")
    model = peft.get_peft_model(model, lora)
    head = torch.nn.Linear(model.config.hidden_size, setting["num_classes"])
    params = [p for p in model.parameters() if p.requires_grad] + list(head.parameters())
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
                mask = torch.from_numpy(batch["padding_mask"].astype(np.int64))
                hidden = model(input_ids=torch.from_numpy(batch["token_ids"].astype(np.int64)),
                               attention_mask=mask,
                               token_type_ids=torch.from_numpy(
                                   batch["segment_ids"].astype(np.int64))).last_hidden_state
                weights = mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
                loss = torch.nn.functional.cross_entropy(
                    head(pooled), torch.from_numpy(batch["labels"].astype(np.int64)))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(float(loss.detach()))
                examples += len(batch["labels"])
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
              "peak_rss_mb": resident_mb("VmHWM"),
              "libraries_rss_mb": libraries_mb,
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "peft": peft.__version__}}
    (work / "peft.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
