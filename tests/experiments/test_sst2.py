"""experiments/sst2's issue-51 experiments, sst2_clients_mean and sst2_dirichlet_mean: their
cells, classifier and averaging-error column, and the pooler-era table beside them, with the
training runs replaced by a recorder of their RunConfigs that writes the summary a finished run
would."""

import dataclasses
import json
import pathlib

import pytest

from experiments import sst2, sst2_protocol
from runner import running


def _value(config, flag):
    """The run's field `flag` as its command-line text (lists comma-separated)."""
    value = config.get(flag)
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _write_summary(folder: pathlib.Path, rounds: int, test: float, dev: float | None = None):
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({
        "rounds_completed": rounds, "communication_rounds": rounds,
        "upload_bytes_per_client_total": 0,
        "final": {"eval_accuracy": test if dev is None else dev, "eval_test_accuracy": test}}))


# ------------------------------------------------------------------------------------------------
# sst2_clients_mean and sst2_dirichlet_mean


def _mean_train(monkeypatch, calls, best=None, errors=None):
    """A train.py whose dev and test accuracy peak at lr `best[method]` (default 0.3), falling
    0.01 per unit of |log lr − log best|; FedAvg-LoRA runs write `errors[seed]` into metrics.csv
    as train/averaging_error (one row per value)."""
    import math

    def fake_train(config, what, isolate=False):
        calls.append(config)
        run_dir = pathlib.Path(_value(config, "output_dir"))
        method = run_dir.parts[-4]
        seed, lr = int(_value(config, "seed")), float(_value(config, "learning_rate"))
        accuracy = 0.8 - 0.01 * abs(math.log(lr / (best or {}).get(method, 0.3)))
        _write_summary(run_dir, int(_value(config, "rounds")), accuracy)
        values = (errors or {}).get(seed) if method == "fedavg_lora" else None
        lines = ["round,train/averaging_error"] + [f"{i},{v}" for i, v in enumerate(values or ())]
        (run_dir / "metrics.csv").write_text("\n".join(lines if values else ["round"]) + "\n")

    monkeypatch.setattr(sst2_protocol, "run_training", fake_train)


def test_sst2_clients_mean_runs_only_its_cells_with_the_corrected_classifier(
        tmp_path, monkeypatch):
    """Full scale: RoLoRA, FedAvg-LoRA, FFA-LoRA at N = 3 and 50, FlexLoRA at 50 only, the
    centralized run; every run passes --pooling=mean --head=linear and no --sequence_length,
    on MiniLM with LoRA on layers 3-5, 10 steps of batch 16, the test split; rounds 500 at
    N = 3 (and centralized), ⌊500·3/50 + ½⌋ = 30 at N = 50. FFA-LoRA's accuracy peaks at 3.0:
    its grid runs 1.0's edge 3.0, then 3.0's edge 10.0, and stops with 3.0 inside."""
    monkeypatch.setitem(sst2.POOLER_ERA_ARCHIVES, "sst2_clients_mean", str(tmp_path / "none"))
    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2" / "test-labeled.tsv").write_text("sentence\tlabel\n")
    calls = []
    _mean_train(monkeypatch, calls, best={"ffa_lora": 3.0})
    ctx = running.Context("sst2_clients_mean", "full", tmp_path / "out", resume=True, seed=0,
                          data_dir=tmp_path)
    result = sst2.run_sst2_clients_mean(ctx)
    cells = {(_value(a, "output_dir").split("/")[-4], int(_value(a, "num_clients")),
              int(_value(a, "rounds"))) for a in calls}
    assert cells == {(m, 3, 500) for m in ("rolora", "fedavg_lora", "ffa_lora")} | {
        (m, 50, 30) for m in ("rolora", "fedavg_lora", "ffa_lora", "flexlora")} | {
        ("centralized", 1, 500)}
    for config in calls:
        assert (config.model.pooling, config.model.head, config.output.eval_test) == (
            "mean", "linear", True)
        assert config.task.sequence_length is None and "sequence_length" not in config.changed()
        for flag, value in (("backbone", "minilm"), ("lora_layers", "3,4,5"),
                            ("local_steps", "10"), ("batch_size", "16"), ("rank", "4"),
                            ("lora_targets", "query,value")):
            assert _value(config, flag) == value
    ffa = [float(_value(a, "learning_rate")) for a in calls
           if "/ffa_lora/N3/seed0/" in _value(a, "output_dir")]
    assert ffa == [0.1, 0.3, 1.0, 3.0, 10.0]
    # 8 cells: 3 grid rates + 2 more seeds each, FFA-LoRA's two grids 2 edge rates more each.
    assert len(calls) == 8 * 5 + 2 * 2
    assert {(r["key"], r["clients"], r["learning_rate"], r["seeds_done"])
            for r in result.table.rows if r["key"] == "ffa_lora"} == {
        ("ffa_lora", 3, 3.0, "3/3"), ("ffa_lora", 50, 3.0, "3/3")}
    assert "corrected classifier: mean pooling, linear head, whole sentences" in \
        result.table.title
    assert set(result.extra_tables) == {"drops", "claims"}   # no pooler-era archive here


def test_the_averaging_error_column_is_fedavg_loras_mean_over_rounds_then_seeds(
        tmp_path, monkeypatch):
    """sst2_dirichlet_mean runs RoLoRA and FedAvg-LoRA at N = 20 on Dirichlet(0.5) shards with
    the corrected classifier. FedAvg-LoRA's train/averaging_error per round: seed 0 (0.1, 0.3),
    seed 1 (0.2, blank, 0.6), seed 2 (0.6): run means 0.2, 0.4, 0.6, their mean 0.4; RoLoRA's
    runs have no such column: blank."""
    cfg = dict(sst2_protocol.SST2_MEAN_SCALES["small"], learning_rates=(0.3,), seeds=3)
    monkeypatch.setitem(sst2_protocol.SST2_MEAN_SCALES, "small", cfg)
    monkeypatch.setattr(sst2, "label_mix_accuracy", lambda *a: (0.5, 0.5))
    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2" / "test-labeled.tsv").write_text("sentence\tlabel\n")
    calls = []
    _mean_train(monkeypatch, calls, errors={0: (0.1, 0.3), 1: (0.2, "", 0.6), 2: (0.6,)})
    ctx = running.Context("sst2_dirichlet_mean", "small", tmp_path / "out", resume=True,
                          seed=0, data_dir=tmp_path)
    result = sst2.run_sst2_dirichlet_mean(ctx)
    assert {(_value(a, "output_dir").split("/")[-4], _value(a, "num_clients"),
             _value(a, "partition"), _value(a, "dirichlet_alpha")) for a in calls} == {
        (m, "20", "dirichlet", "0.5") for m in ("rolora", "fedavg_lora")}
    error = {r["key"]: r["averaging_error"] for r in result.table.rows}
    assert error["fedavg_lora"] == pytest.approx(0.4) and error["rolora"] is None
    assert "averaging_error" in [c.key for c in result.table.columns]
    assert "N = 20: 0.4" in result.extra_tables["claims"].title
    (claim,) = result.extra_tables["claims"].rows
    assert claim["per_seed"] == "0: +0.00, 1: +0.00, 2: +0.00"


def test_the_pooler_era_figures_stand_beside_the_new_cells(tmp_path, monkeypatch):
    """At the full scale the _mean experiment reads the pooler-era archive in place: RoLoRA at
    N = 50 there ended at test 0.80, 0.82, 0.84 (mean 0.82, ddof = 1 std 0.02); the new runs
    at 0.8: 100·(0.80 − 0.82) = −2 points. A cell missing from the archive is blank."""
    old = tmp_path / "old_archive"
    for seed, accuracy in enumerate((0.80, 0.82, 0.84)):
        _write_summary(old / "rolora" / "N50" / f"seed{seed}" / "lr1", 30, accuracy)
    monkeypatch.setitem(sst2.POOLER_ERA_ARCHIVES, "sst2_dirichlet_mean", str(old))
    monkeypatch.setitem(sst2_protocol.SST2_CLAIM_SCALES, "full", dict(
        sst2_protocol.SST2_CLAIM_SCALES["full"], learning_rates=(1.0,), edge_rates=()))
    new = [dict(key="rolora", clients=50, method="RoLoRA", learning_rate=0.3,
                test_accuracy="0.8000 ± 0.0000", test_mean=0.8, seeds_done="3/3"),
           dict(key="fedavg_lora", clients=50, method="FedAvg-LoRA", learning_rate=0.3,
                test_accuracy=None, test_mean=None, seeds_done="0/3")]
    ctx = running.Context("sst2_dirichlet_mean", "full", tmp_path / "out", resume=True, seed=0,
                          data_dir=tmp_path)
    monkeypatch.setattr(sst2_protocol, "run_training", lambda *a: pytest.fail("read only"))
    table = sst2.pooler_era_table(ctx, new, "sst2_dirichlet_mean", {"partition": "iid"}, (50,),
                                  False)
    rolora, fedavg = table.rows
    assert (rolora["old_test"], rolora["old_seeds"], rolora["old_lr"]) == (
        "0.8200 ± 0.0200", "3/3", 1.0)
    assert rolora["change"] == pytest.approx(-2.0)
    assert fedavg["old_test"] is None and fedavg["change"] is None
    assert "frozen-pooler protocol: BERT's untrained pooler, 32 tokens" in table.title
    small = dataclasses.replace(ctx, scale="small")
    assert sst2.pooler_era_table(small, new, "sst2_dirichlet_mean", [], (50,), False) is None
