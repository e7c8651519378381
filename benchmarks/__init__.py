"""The performance benchmark behind `scripts/benchmark.py` (docs/PERFORMANCE.md).

One module per job: `config` (settings, no TensorFlow), `build` (model, data and the tffl
process per algorithm), `plain` (the one plain reference loop: the engine's client loop without
TFF, which both suites measure against), `measure` (memory, CPU, compilation and profile
helpers), `rounds` (run_rounds' callbacks that measure a configuration's rounds), `run` (TFF and
plain rounds, alternating, per configuration), `report` (targets, tables, files) and `targets`
(`--suite=targets`: its main setting and results, with `targets_scale`, its scaling and large
parts, `evaluation`, the seconds of a decoder's dev evaluation, `startup`, a decoder's first
rounds with and without TFF's Grappler pass, and `peer`, tffl beside a Transformers + PEFT FedAvg
loop, `peft_loop`, run by a Python that has torch). A client of the runner (`runner.algorithms`,
`runner.cli`, `runner.machine`), never imported by it.
"""
