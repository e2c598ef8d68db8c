"""Model objects as int columns, for the stages that work on numpy arrays.

Tracks, (name, category) pairs, flow categories and ids are Python objects; a stage that
sorts or groups on arrays first numbers them. One pass in C does it: a dict's setdefault with
a running count gives each value the position where it first occurs.
"""

from __future__ import annotations

from itertools import count
from typing import Any, Iterable

import numpy as np


def first_positions(values: Iterable[Any], length: int) -> tuple[np.ndarray, dict[Any, int]]:
    """Per value, the position of its first occurrence (equal values, equal codes; a new
    value's code is above every earlier one's), and each distinct value with that position,
    in the order they first occur. `length`: how many values there are."""
    first: dict[Any, int] = {}
    return np.fromiter(map(first.setdefault, values, count()), np.int64, length), first
