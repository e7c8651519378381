"""The simulation: the driver (`tffl.simulation.driver.run_rounds`), participation with SRPFL,
checkpoints, metrics and plots."""
