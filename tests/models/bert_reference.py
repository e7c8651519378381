"""What Hugging Face computes for a BERT / RoBERTa encoder with PEFT LoRA adapters, and what a
sentence-transformers folder's pipeline computes after it, in numpy (float64), from files alone:
the reference of tests/models/test_peft_export.py and tests/runner/test_export.py.

Written from HF's BertModel / RobertaModel (embeddings + LayerNorm; per layer self-attention
with padded keys masked, output dense + residual + LayerNorm, the feed-forward's GELU, dense +
residual + LayerNorm), PEFT's merge W + (lora_alpha/r)·B·A, and sentence-transformers' Pooling
(masked mean or CLS token) and Dense (act(x·Wᵀ + b)) modules; nothing here imports tffl.
"""

import json
import math

import numpy as np
import safetensors.numpy


def layer_norm(x, g, b, eps):
    """(x − mean) / √(var + eps)·g + b over the last axis."""
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def gelu(x, act):
    """HF's `hidden_act`: "gelu" the exact erf GELU, "gelu_new" its tanh approximation."""
    if act == "gelu":
        return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def merged(t, adapters, config):
    """PEFT's merge: W ← W + (lora_alpha/r)·B·A for every adapted module."""
    t = dict(t)
    scale = config["lora_alpha"] / config["r"]
    for key, a in adapters.items():
        if key.endswith(".lora_A.weight"):
            module = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            b = adapters[key.replace("lora_A", "lora_B")]
            t[module + ".weight"] = t[module + ".weight"] + scale * b @ a
    for key, v in adapters.items():
        if "lora_" not in key:
            t[key.removeprefix("base_model.model.")] = v
    return {k: v.astype(np.float64) for k, v in t.items()}


def hidden_states(t, hf_config, prefix, ids, mask):
    """HF BertModel / RobertaModel's last hidden state (numpy) over the tensors `t` named
    `<prefix>embeddings...`, for token ids right-padded where `mask` is 0: HF adds the dtype's
    minimum to the attention scores of padded keys (a padded query's state is read by nobody)."""
    eps, act = hf_config["layer_norm_eps"], hf_config["hidden_act"]
    heads, p = hf_config["num_attention_heads"], prefix
    seq = ids.shape[1]
    # RoBERTa numbers real tokens from padding_idx + 1 = 2.
    positions = np.arange(seq) + (2 if hf_config.get("model_type") == "roberta" else 0)
    x = (t[p + "embeddings.word_embeddings.weight"][ids]
         + t[p + "embeddings.position_embeddings.weight"][positions]
         + t[p + "embeddings.token_type_embeddings.weight"][0])
    x = layer_norm(x, t[p + "embeddings.LayerNorm.weight"], t[p + "embeddings.LayerNorm.bias"], eps)
    key_bias = np.where(mask[:, None, None, :] > 0, 0.0, np.finfo(np.float32).min)

    def linear(h, name):
        return h @ t[name + ".weight"].T + t[name + ".bias"]

    for i in range(hf_config["num_hidden_layers"]):
        q = p + f"encoder.layer.{i}."
        split = [linear(x, q + f"attention.self.{n}").reshape(*x.shape[:2], heads, -1)
                 for n in ("query", "key", "value")]
        scores = np.einsum("bqhd,bkhd->bhqk", split[0], split[1]) / math.sqrt(split[0].shape[-1])
        scores = scores + key_bias
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        ctx = np.einsum("bhqk,bkhd->bqhd", probs, split[2]).reshape(x.shape)
        x = layer_norm(linear(ctx, q + "attention.output.dense") + x,
                        t[q + "attention.output.LayerNorm.weight"],
                        t[q + "attention.output.LayerNorm.bias"], eps)
        h = gelu(linear(x, q + "intermediate.dense"), act)
        x = layer_norm(linear(h, q + "output.dense") + x, t[q + "output.LayerNorm.weight"],
                        t[q + "output.LayerNorm.bias"], eps)
    return x


# sentence-transformers' Dense activations, by the torch class its config names.
ST_ACTIVATIONS = {"torch.nn.modules.linear.Identity": lambda x: x,
                  "torch.nn.modules.activation.Tanh": np.tanh}


def recipe_logits(folder, base, ids, mask, *, lora=True, hidden_act=None):
    """docs/models.md's recipe, in numpy, from the files alone: the base model as `AutoModel`
    loads it (the base checkpoint's `model.safetensors` and `config.json`; transformers drops a
    `bert.` / `roberta.` prefix when it loads a base model), PEFT's adapters merged as PEFT
    merges them (W + (lora_alpha/r)·B·A), its last hidden state, then the sentence-transformers
    pipeline of `modules.json`: the Pooling module's mode (masked mean or CLS) and each Dense
    module's act(x·Wᵀ + b). `lora=False` leaves the adapters out, `hidden_act` replaces the
    checkpoint's activation (to show that the comparison sees them)."""
    hf_config = json.loads((base / "config.json").read_text())
    hf_config["hidden_act"] = hidden_act or hf_config["hidden_act"]
    prefix = hf_config["model_type"] + "."
    tensors = {k.removeprefix(prefix): v for k, v in
               safetensors.numpy.load_file(str(base / "model.safetensors")).items()}
    config = json.loads((folder / "adapter_config.json").read_text())
    adapters = safetensors.numpy.load_file(str(folder / "adapter_model.safetensors"))
    x = hidden_states(merged(tensors, adapters if lora else {}, config), hf_config, "", ids, mask)
    modules = json.loads((folder / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in modules[:2]] == ["Transformer", "Pooling"]
    assert modules[0]["path"] == ""    # the Transformer module is the adapter folder itself
    for module in modules[1:]:
        path = folder / module["path"]
        module_config = json.loads((path / "config.json").read_text())
        if module["type"].endswith("Pooling"):
            modes = [k for k, v in module_config.items() if k.startswith("pooling_mode_") and v]
            assert len(modes) == 1 and module_config["word_embedding_dimension"] == x.shape[-1]
            m = mask[..., None].astype(np.float64)
            x = {"pooling_mode_mean_tokens": (x * m).sum(1) / m.sum(1),
                 "pooling_mode_cls_token": x[:, 0]}[modes[0]]
        else:
            assert module["type"].endswith("Dense")
            dense = safetensors.numpy.load_file(str(path / "model.safetensors"))
            w, b = dense["linear.weight"], dense["linear.bias"]
            assert w.shape == (module_config["out_features"], module_config["in_features"])
            x = ST_ACTIVATIONS[module_config["activation_function"]](x @ w.T + b)
    return x
