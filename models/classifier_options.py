"""The choices of a text classifier over a backbone (`models.backbones.build_classifier`), kept
apart from the model code so that a command line can list them without importing TensorFlow.

- `POOLINGS`: how the last hidden state h (batch, seq, hidden) becomes sentence features:
  "mean" (Σ_t m_t h_t / Σ_t m_t, m the padding mask), "cls" (h_0) or "pooler" (BERT's
  tanh(h_0 W + b), trained with the head).
- `HEADS`: "linear" (Dense to the classes) or "dense_tanh" (RoBERTa's classification head:
  Dense(hidden) + tanh, then Dense to the classes).

>>> POOLINGS, HEADS
(('mean', 'cls', 'pooler'), ('linear', 'dense_tanh'))
"""

POOLINGS = ("mean", "cls", "pooler")
HEADS = ("linear", "dense_tanh")
