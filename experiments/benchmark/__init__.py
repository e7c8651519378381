"""The performance benchmark behind `scripts/benchmark.py` (docs/PERFORMANCE.md).

One module per job: `config` (settings, no TensorFlow), `build` (model, data and the tffl
process per algorithm), `plain` (the baseline: the engine's client loop without TFF), `measure`
(memory, CPU, compilation and profile helpers), `run` (TFF and plain rounds, alternating, per
configuration), `report` (targets, tables, files) and `targets` (`--suite=targets`).
"""
