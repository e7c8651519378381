"""models/gemma3_backbone.py built the way TFF traces a model: inside a TF1 graph. Keras 2 then
builds the functional model by giving every tensor that reaches a layer call a Keras history, and
runs in a session each constant-valued one it finds (with the model's variable initializers:
268M random draws for Gemma 3 270M, each time). The decoder keeps its masks inside its
attention layer so that no such tensor exists: building needs no session at all."""

import numpy as np
import pytest
import tensorflow as tf
from keras.src import backend as keras_backend

from models import gemma3_backbone

CONFIG = dict(vocabulary_size=64, num_layers=3, num_query_heads=2, num_key_value_heads=1,
              hidden_dim=16, intermediate_dim=32, head_dim=8, sliding_window=2,
              global_layer_every=3)


def test_building_in_a_graph_runs_no_session(monkeypatch):
    def no_session(*args, **kwargs):
        raise AssertionError("Keras ran a session while building the backbone")

    monkeypatch.setattr(keras_backend, "get_session", no_session)
    with tf.Graph().as_default():
        backbone = gemma3_backbone.Gemma3Backbone(gemma3_backbone.Gemma3BackboneConfig(**CONFIG))
    assert len(backbone.transformer_layers) == 3


@pytest.mark.parametrize("initializer", ["random", "zeros"])
def test_the_initializer_choice_round_trips(initializer):
    backbone = gemma3_backbone.Gemma3Backbone(gemma3_backbone.Gemma3BackboneConfig(**CONFIG),
                                              initializer=initializer)
    rebuilt = gemma3_backbone.Gemma3Backbone.from_config(backbone.get_config())
    assert rebuilt.get_config()["initializer"] == initializer
    kernels = [v.numpy() for v in backbone.trainable_variables if "kernel" in v.name
               or "embeddings" in v.name]
    assert all((np.abs(k).max() == 0) == (initializer == "zeros") for k in kernels)


def test_an_unknown_initializer_is_refused():
    with pytest.raises(ValueError, match="initializer='ones': choose 'random' or 'zeros'"):
        gemma3_backbone.Gemma3Backbone(gemma3_backbone.Gemma3BackboneConfig(**CONFIG),
                                       initializer="ones")
