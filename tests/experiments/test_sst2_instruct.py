"""experiments/sst2_instruct (issue 54, item 6) in sittings: the runs it makes (one per method and
N, the decoder task, all clients every round), --methods, --archive_dir and --collect, with the
training runs replaced by a recorder of their RunConfigs that writes the summary a finished run
would."""

import json
import pathlib

from experiments import running, sst2_instruct


def _fake_train(configs):
    def fake_train(config, what, isolate=False):
        run_dir = pathlib.Path(config.output.output_dir)
        configs.append(config)
        run_dir.mkdir(parents=True, exist_ok=True)
        accuracy = {"rolora": 0.8, "ffa_lora": 0.7}[config.algorithm.algorithm[0]]
        (run_dir / "metrics.csv").write_text(
            f"round,communication_rounds,eval_accuracy\n6,6,{accuracy}\n")
        (run_dir / "summary.json").write_text(json.dumps({
            "rounds_completed": config.algorithm.rounds, "communication_rounds": 6,
            "upload_bytes_per_client_total": 6 * 2048,
            "final": {"eval_accuracy": accuracy, "eval_likelihood_accuracy": accuracy + 0.1,
                      "eval_unparseable": 0.05, "eval_loss": 0.5}}))
    return fake_train


def test_runs_archive_and_collect(tmp_path, monkeypatch):
    configs = []
    monkeypatch.setattr(sst2_instruct, "run_training", _fake_train(configs))
    monkeypatch.setattr(sst2_instruct, "need_data", lambda ctx, name: None)
    archive = tmp_path / "archive"

    def rows(output_dir, **kw):
        ctx = running.Context("sst2_instruct", "small", output_dir, resume=True, seed=0,
                              data_dir=tmp_path, methods=("rolora", "ffa_lora"), **kw)
        return sst2_instruct.run_sst2_instruct(ctx).table.rows

    first = rows(tmp_path / "first", archive_dir=archive)
    assert [(c.algorithm.algorithm, c.task.num_clients, c.participation.clients_per_round)
            for c in configs] == [(("rolora",), 3, 3), (("ffa_lora",), 3, 3),
                                  (("rolora",), 20, 20), (("ffa_lora",), 20, 20)]
    assert {(c.task.task, c.model.backbone) for c in configs} == {("sst2_instruct", "gpt2_tiny")}
    assert [(r["method"], r["clients"], r["generation_accuracy"], r["likelihood_accuracy"],
             r["upload_kib"]) for r in first] == [
        ("RoLoRA", 3, 0.8, 0.9, 2.0), ("FFA-LoRA", 3, 0.7, 0.7 + 0.1, 2.0),
        ("RoLoRA", 20, 0.8, 0.9, 2.0), ("FFA-LoRA", 20, 0.7, 0.7 + 0.1, 2.0)]
    configs.clear()
    assert rows(tmp_path / "fresh", archive_dir=archive) == first and configs == []
    assert rows(tmp_path / "empty", collect=True) == [] and configs == []
