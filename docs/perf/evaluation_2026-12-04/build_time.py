"""Seconds to build Gemma 3 270M's backbone (zeros), apply LoRA (r = 8 on query and value of
layers 14-17) and build the causal LM around it (`models.causal_lm.build_causal_lm`), twice.

    uv run python docs/perf/evaluation_2026-12-04/build_time.py
"""
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from models import causal_lm, decoders, lora_targets  # noqa: E402

decoder = decoders.build_decoder("gemma3_270m")
config = lora_targets.LoraConfig(rank=8, targets=("query", "value"), layers=(14, 15, 16, 17))
for _ in range(2):
    t0 = time.perf_counter()
    backbone = decoder.backbone_fn()
    t1 = time.perf_counter()
    lora_targets.apply_lora(backbone, config)
    t2 = time.perf_counter()
    causal_lm.build_causal_lm(backbone)
    t3 = time.perf_counter()
    print(f"backbone {t1 - t0:.1f} s, lora {t2 - t1:.1f} s, causal_lm {t3 - t2:.1f} s", flush=True)
