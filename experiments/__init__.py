"""The papers' experiments behind `scripts/reproduce.py`, one module per family; each
`run_<name>(ctx) -> Result` writes nothing but its runs and returns its table and plot."""
