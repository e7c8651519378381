"""`--suite=targets`'s evaluation part (benchmarks/targets.py): the seconds of `sst2_instruct`'s
dev evaluation on Gemma 3 270M.

The task is the one `scripts/train.py --task=sst2_instruct --backbone=gemma3_270m` builds
(`tasks.instruct_run_task`; RoLoRA's budget: LoRA r = 8 on query and value of layers 14-17), its
model at the pretrained weights (LoRA's B = 0: the zero-shot model). Its `evaluate` reads the 872
dev sentences; " negative" and " positive" are one token each for Gemma 3, so one forward pass
per batch gives every measure (`instruct_run_task.make_evaluator`). The first call traces the
graph; the target is the calls after it: at most `TARGETS["evaluation_seconds"]` (60 s) on 2
cores (`benchmarks.config`).

Then multi-token generation (`run_generation`): the greedy continuations of the first
`GENERATION_PROMPTS` dev sentences' prompts, `GENERATION_TOKENS` tokens each (no stop token, so
every row runs the whole length), by `models.lm_evaluation.generate` with its key/value cache and
without it (the whole buffer at every token), one call each (each traces its own graphs), on the
same pretrained Gemma 3 270M. Both should give the same tokens: `same_tokens` records whether
they did, and a line is printed when they did not.
"""

from __future__ import annotations

import pathlib
import time

from benchmarks.config import TargetsConfig

EVALUATION_CALLS = 3  # the first traces; the mean of the others is the figure
GENERATION_PROMPTS = 32
GENERATION_TOKENS = 16


def run_evaluation(config: TargetsConfig, log) -> dict:
    """{"first_call_seconds", "seconds" (the later calls' mean), "calls", "metrics"} of the
    dev evaluation, and "generation" (`run_generation`) (module docstring)."""
    import tensorflow_federated as tff

    from tasks import registry
    from tasks.task_config import TaskSpec

    spec = TaskSpec().with_changes(
        task="sst2_instruct", backbone="gemma3_270m", data_dir=config.data_dir, num_clients=3,
        rank=8, lora_layers=(14, 15, 16, 17), seed=config.seed)
    task = registry.build_run_task(spec)
    model = task.keras_model_fn()
    weights = tff.learning.models.ModelWeights(
        [v.numpy() for v in model.trainable_variables], task.pretrained_non_trainable())
    seconds = []
    for call in range(EVALUATION_CALLS):
        started = time.perf_counter()
        metrics = task.evaluate(weights)
        seconds.append(time.perf_counter() - started)
        log(f"evaluation: call {call + 1}/{EVALUATION_CALLS}, {seconds[-1]:.1f} s, "
            f"generation accuracy {metrics['accuracy']:.4f}")
    del model, weights, task
    return {"first_call_seconds": seconds[0],
            "seconds": sum(seconds[1:]) / (len(seconds) - 1), "calls": seconds,
            "metrics": metrics, "generation": run_generation(config, log)}


def run_generation(config: TargetsConfig, log) -> dict:
    """{"cached_seconds", "uncached_seconds", "ratio", "same_tokens", "prompts", "new_tokens"}
    of multi-token generation with and without the key/value cache (module docstring)."""
    from models import decoders, lm_evaluation
    from tasks import instructions, text_files

    dev = text_files.load_glue_tsv(pathlib.Path(config.data_dir) / "sst2", splits=["dev"])["dev"]
    examples = instructions.from_sentiment(dev).subset(range(GENERATION_PROMPTS))
    decoder = decoders.build_decoder("gemma3_270m")
    backbone = decoder.pretrained_fn()
    prompts = decoders.prompt_ids(decoder, examples.prompts)
    out, seconds = {}, {}
    for use_cache in (True, False):
        started = time.perf_counter()
        out[use_cache] = lm_evaluation.generate(backbone, prompts, GENERATION_TOKENS,
                                                use_cache=use_cache)
        seconds[use_cache] = time.perf_counter() - started
        log(f"generation: {len(prompts)} prompts x {GENERATION_TOKENS} tokens, "
            f"{'with' if use_cache else 'without'} the key/value cache: {seconds[use_cache]:.1f} s")
    if out[True] != out[False]:
        log("generation: the cached and uncached continuations differ on "
            f"{sum(a != b for a, b in zip(out[True], out[False]))} of {len(prompts)} prompts")
    return {"cached_seconds": seconds[True], "uncached_seconds": seconds[False],
            "ratio": seconds[True] / seconds[False], "same_tokens": out[True] == out[False],
            "prompts": len(prompts), "new_tokens": GENERATION_TOKENS,
            "prompt_tokens": [len(p) for p in prompts]}
