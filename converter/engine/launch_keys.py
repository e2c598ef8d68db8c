"""Slices' launch keys (model/launch_keys.py) read from their args where the trace has not
read them yet, and kept on it: attribution and the idle causes ask for the same GPU slices'
and runtime calls', which would otherwise each be read and decoded twice."""

from __future__ import annotations

import numpy as np

from .. import kineto
from ..model import Trace
from ..model.columns import sorted_distinct
from ..model.launch_keys import NO_ID, NO_STREAM, LaunchKeys


def launch_keys(trace: Trace, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The correlation id (NO_ID: none) and stream (NO_STREAM: none) of each of `rows`, as
    kineto.launch_keys reads them."""
    keys = trace.launch_keys.covering(len(trace.slices))
    unread = sorted_distinct(rows[~keys.known[rows]])
    if len(unread):
        found = [kineto.launch_keys(text) for text in trace.args_texts(unread)]
        keys.correlation[unread] = np.fromiter((NO_ID if key is None else key for key, _ in found), np.int64,
                                               len(found))
        keys.stream[unread] = np.fromiter((NO_STREAM if key is None else key for _, key in found), np.int64,
                                          len(found))
        keys.known[unread] = True
    trace.launch_keys = keys
    return keys.correlation[rows], keys.stream[rows]
