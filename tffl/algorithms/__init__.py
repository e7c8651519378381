"""The algorithms: one module per family (federated LoRA, personalized, linear) and `ALGORITHMS`,
the one registry (`tffl.algorithms.registry`)."""
