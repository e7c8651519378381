"""The command-line runner: a run's typed configuration (`run_config`), the flags that fill it
(`train_flags`, `train_options`), one training run (`training`, with the name -> tffl wiring of
`algorithms`), running a configuration (`run`) and reporting it (`comparison`), and what every
script shares (`cli`, `tensorflow_import`, `machine`); a trained run's folder back to its model
(`trained_run`), text generated from it (`generation`), its adapters exported for Hugging Face
PEFT (`export`) and the tffl side of PEFT's cross-check (`crosscheck`); a user's
`ClientData` as a run (`own_data`); and the harness `scripts/reproduce.py` runs the papers'
experiments on: their training runs (`running`), `--estimate`'s probes (`estimate`), the archive
of finished runs (`archive`), tables and plots (`report`) and verdicts from paired differences
(`verdicts`). It imports tffl, models and tasks, never experiments/."""
