"""Unique int32 process and thread ids for the output.

Perfetto's process and thread descriptors hold int32 ids, and every pid and tid must be
unique where the input's were not (stream 7 on every GPU, string ids such as "Spans"). An input id is kept where it
is valid and free; otherwise the next fresh one is handed out.
"""

from __future__ import annotations

from typing import Any, Optional

from ..errors import CgtraceError

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


class IdSpace:
    """Ids unique within this space. Fresh ids count up from `first_fresh` and also skip
    `avoid`, a set several spaces may share (each adds what it hands out), so that fresh ids
    of one never equal any id of another."""

    def __init__(self, first_fresh: int, avoid: Optional[set[int]] = None):
        self._taken: set[int] = set()
        self._avoid = self._taken if avoid is None else avoid
        self._next = first_fresh

    def claim(self, preferred: Any = None, zero: bool = False) -> int:
        """`preferred` where it is a free int32 (negative ones too: Kineto writes thread ids
        that overflowed), else a fresh id. 0 only with `zero`: tid 0 is the idle thread's,
        never a thread's, but pid 0 (GPU 0's) can be a process."""
        if type(preferred) is int and INT32_MIN <= preferred <= INT32_MAX and (preferred or zero) \
                and preferred not in self._taken:
            claimed = preferred
        else:
            while self._next in self._taken or self._next in self._avoid:
                self._next += 1
            if self._next > INT32_MAX:
                raise CgtraceError("too many processes or threads for int32 ids; cut the trace down with --window")
            claimed = self._next
        self._taken.add(claimed)
        self._avoid.add(claimed)
        return claimed
