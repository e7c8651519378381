"""The client datasets of the linear algorithms' tests (fedrep_linear, flute_linear,
adaptpfl_linear): one OrderedDict of float32 features `x` and targets `y` per client."""

import collections

import numpy as np


def clients(xs, ys) -> list[collections.OrderedDict]:
    """[{x: X_i, y: y_i}] as float32, one per client."""
    return [collections.OrderedDict(x=np.asarray(x, np.float32), y=np.asarray(y, np.float32))
            for x, y in zip(xs, ys)]
