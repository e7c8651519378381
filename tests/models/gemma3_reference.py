"""An independent numpy forward pass of Gemma 3 (float64) on GGUF-named (out, in) tensors, and
random GGUF-named tensors of a tiny config: the reference of tests/models/test_gemma3.py and
test_peft_decoder.py."""

import gguf
import numpy as np


def _rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def _rope(x, base):
    """x (T, heads, D): rotate the halves of each head vector by position·base^(−2i/D)."""
    length, _, width = x.shape
    angles = np.arange(length)[:, None] * base ** (-np.arange(0, width, 2) / width)[None]
    cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]
    first, second = x[..., : width // 2], x[..., width // 2:]
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _numpy_attention(t, prefix, n, config, is_global):
    length, width, eps = n.shape[0], config["head_dim"], config["layer_norm_epsilon"]
    base = config["global_rope_base"] if is_global else config["local_rope_base"]
    q, k, v = ((n @ t[prefix + name].T).reshape(length, -1, width)   # (T, heads, D)
               for name in ("attn_q", "attn_k", "attn_v"))
    heads, kv_heads = q.shape[1], k.shape[1]
    scale = config.get("query_scale") or width ** -0.5
    q = _rope(_rms_norm(q, t[prefix + "attn_q_norm"], eps), base) * scale
    k = _rope(_rms_norm(k, t[prefix + "attn_k_norm"], eps), base)
    position = np.arange(length)
    allowed = position[None, :] <= position[:, None]
    if not is_global:
        allowed &= position[:, None] - position[None, :] < config["sliding_window"]
    out = np.zeros((length, heads, width))
    for u in range(heads):
        kv = u // (heads // kv_heads)
        scores = np.where(allowed, q[:, u] @ k[:, kv].T, -np.inf)
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        out[:, u] = (weights / weights.sum(axis=-1, keepdims=True)) @ v[:, kv]
    return out.reshape(length, heads * width) @ t[prefix + "attn_output"].T


def numpy_hidden(tensors, config, token_ids):
    """Final-normed hidden states (T, H) of one sequence, from the architecture description."""
    t = {name: np.asarray(value, np.float64) for name, value in tensors.items()
         if name != "token_embd"}
    eps = config["layer_norm_epsilon"]
    x = np.asarray(tensors["token_embd"][token_ids], np.float64) * np.sqrt(config["hidden_dim"])
    for i in range(config["num_layers"]):
        prefix, is_global = f"blk.{i}.", (i + 1) % config["global_layer_every"] == 0
        attended = _numpy_attention(t, prefix, _rms_norm(x, t[prefix + "attn_norm"], eps),
                                    config, is_global)
        h = x + _rms_norm(attended, t[prefix + "post_attention_norm"], eps)
        n = _rms_norm(h, t[prefix + "ffn_norm"], eps)
        ffn = (_gelu_tanh(n @ t[prefix + "ffn_gate"].T) * (n @ t[prefix + "ffn_up"].T)
               ) @ t[prefix + "ffn_down"].T
        x = h + _rms_norm(ffn, t[prefix + "post_ffw_norm"], eps)
    return _rms_norm(x, t["output_norm"], eps)


def numpy_logits(tensors, config, token_ids, positions=slice(None)):
    """Logits (T, V), or at `positions`, with the output embedding tied to the input one."""
    hidden = numpy_hidden(tensors, config, token_ids)[positions]
    return hidden @ np.asarray(tensors["token_embd"], np.float64).T


def random_gguf_tensors(config, quantize=True, seed=3):
    """Random GGUF-named tensors of `config` (float32 values, and what a GGUF file stores): with
    `quantize`, the matrices Q8_0-quantized (their values dequantized) and the embedding
    float16."""
    rng = np.random.default_rng(seed)
    h, f, d = config["hidden_dim"], config["intermediate_dim"], config["head_dim"]
    nd, kd = config["num_query_heads"] * d, config["num_key_value_heads"] * d
    shapes = {"token_embd": (config["vocabulary_size"], h), "output_norm": (h,)}
    for i in range(config["num_layers"]):
        shapes.update({f"blk.{i}.{name}": shape for name, shape in {
            "attn_norm": (h,), "attn_q": (nd, h), "attn_k": (kd, h), "attn_v": (kd, h),
            "attn_q_norm": (d,), "attn_k_norm": (d,), "attn_output": (h, nd),
            "post_attention_norm": (h,), "ffn_norm": (h,), "ffn_gate": (f, h), "ffn_up": (f, h),
            "ffn_down": (h, f), "post_ffw_norm": (h,)}.items()})
    tensors, stored = {}, {}
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name, shape in shapes.items():
        if len(shape) == 1 or not quantize:
            value = rng.normal(1.0 if len(shape) == 1 else 0.0, 0.3, shape).astype(np.float32)
            tensors[name] = stored[name] = value
        elif name == "token_embd":
            stored[name] = rng.normal(0, 1.0, shape).astype(np.float16)
            tensors[name] = stored[name].astype(np.float32)
        else:
            stored[name] = gguf.quants.quantize(rng.normal(0, 0.3, shape).astype(np.float32), q8)
            tensors[name] = gguf.quants.dequantize(stored[name], q8).reshape(shape)
    return tensors, stored
