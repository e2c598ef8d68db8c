"""Each slice's launch keys: the correlation id CUPTI gives a runtime call and the GPU work it
launched, and the stream a GPU slice names, both read from its args. Launch attribution and
the idle causes join launches by them, so each slice's are decoded once
(engine/launch_keys.py) and kept on the trace, where they follow its rows when a window or a
compaction drops some.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

NO_ID = -1  # a slice's correlation id where it has none (CUPTI's ids are not negative)
NO_STREAM = np.iinfo(np.int64).min  # a slice's stream where its args name none


class LaunchKeys(NamedTuple):
    """Per row: whether its keys were read yet (`known`), its correlation id and stream."""

    known: np.ndarray
    correlation: np.ndarray
    stream: np.ndarray

    @classmethod
    def none(cls) -> "LaunchKeys":
        return cls(np.zeros(0, np.bool_), np.zeros(0, np.int64), np.zeros(0, np.int64))

    def covering(self, rows: int) -> "LaunchKeys":
        """These keys for a table of `rows` rows: rows added since are not known yet."""
        missing = rows - len(self.known)
        if missing <= 0:
            return self
        return LaunchKeys(np.concatenate([self.known, np.zeros(missing, np.bool_)]),
                          np.concatenate([self.correlation, np.full(missing, NO_ID, np.int64)]),
                          np.concatenate([self.stream, np.full(missing, NO_STREAM, np.int64)]))

    def kept(self, kept: np.ndarray) -> "LaunchKeys":
        """The keys of the rows where `kept` (a mask over the table) is true, in order."""
        whole = self.covering(len(kept))
        return LaunchKeys(whole.known[kept], whole.correlation[kept], whole.stream[kept])
