"""tffl: federated fine-tuning and personalization as TensorFlow Federated computations.

Importing any part of tffl installs `tffl.runtime`'s exit hook, which stops every TFF worker
process this Python process started (TFF's own default-context worker included).
"""

from tffl import runtime as _runtime  # noqa: F401  (installs the exit hook)
