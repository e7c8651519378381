"""models/decoders.py's text in, text out: `generate_text` against a loop written here over one
prompt at a time (the byte tokenizer by hand, numpy argmax of the last position's logits), the
stop at end of text, and the prompt cut to the decoder's positions."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from models import decoders


@pytest.fixture(scope="module")
def tiny():
    tf.keras.utils.set_random_seed(0)
    decoder = decoders.build_decoder("gpt2_tiny")
    return decoder, decoder.backbone_fn()


def _greedy(backbone, ids, steps, stop):
    """Argmax of the next-token logits, one token at a time, until `stop` or `steps` tokens."""
    ids, out = list(ids), []
    for _ in range(steps):
        x = np.array([ids + out], np.int32)
        hidden = backbone({"token_ids": x, "padding_mask": np.ones_like(x)})
        token = int(np.argmax(backbone.token_embedding(hidden[:, -1], reverse=True).numpy()[0]))
        if token == stop:
            break
        out.append(token)
    return out


def test_each_prompt_continues_as_it_would_alone(tiny):
    decoder, backbone = tiny
    prompts = ["hi", "Review: a fine film\nSentiment:", "caf\u00e9"]
    got = decoders.generate_text(backbone, decoder, prompts, max_new_tokens=5, batch_size=2)
    for prompt, text in zip(prompts, got):
        ids = _greedy(backbone, [256] + list(prompt.encode("utf-8")), 5, stop=256)
        assert text == bytes(i for i in ids if i < 256).decode("utf-8", "replace")


def test_generation_stops_before_the_end_of_text_token(tiny):
    """With end of text declared to be the first new token the model picks after others, the
    tokens before it come out."""
    decoder, backbone = tiny
    ids = _greedy(backbone, [256, 104, 105], 8, stop=-1)
    k = next(k for k in range(1, len(ids)) if ids[k] not in ids[:k])
    stopping = dataclasses.replace(decoder, eos_id=ids[k],
                                   detokenize=lambda t: ",".join(map(str, t)))
    assert decoders.generate_text(backbone, stopping, ["hi"], max_new_tokens=8) == [
        ",".join(map(str, ids[:k]))]


def test_a_prompt_too_long_for_the_positions_keeps_its_end(tiny):
    decoder = dataclasses.replace(tiny[0], max_length=8)
    assert decoders.prompt_ids(decoder, ["abcdefghij", "ab"], max_new_tokens=3) == [
        [256, 103, 104, 105, 106], [256, 97, 98]]
    with pytest.raises(ValueError, match="max_new_tokens=7: gpt2_tiny has 8 positions; pass at "
                                         "most 6"):
        decoders.prompt_ids(decoder, ["a"], max_new_tokens=7)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        decoders.prompt_ids(decoder, ["a", ""])
