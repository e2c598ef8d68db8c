"""Model objects as int columns, for the stages that work on numpy arrays.

Counter tracks, flow categories and ids are Python objects; a stage that sorts or groups on
arrays first numbers them. One pass in C does it: a dict's setdefault with a running count
gives each value the position where it first occurs. Rows grouped by such codes come out in
the order a dict of lists filled row by row would hold them (grouped_in_order).
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


def grouped_in_order(keys: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(key, positions) for each distinct key of `keys`, in the order the keys first come; each
    group's positions ascending (as a dict of lists filled in order would hold them)."""
    if not len(keys):
        return []
    order = np.argsort(keys, kind="stable")
    groups = np.split(order, np.flatnonzero(np.diff(keys[order])) + 1)
    groups.sort(key=lambda positions: int(positions[0]))
    return [(int(keys[positions[0]]), positions) for positions in groups]


def sorted_distinct(values: np.ndarray) -> np.ndarray:
    """The values sorted, without repeats: np.unique's result by one sort. Its hashing is several
    times slower on a million times, and (numpy 2) its first call imports numpy.ma, which every
    command would pay for at start-up."""
    ordered = np.sort(values)
    keep = np.ones(len(ordered), bool)
    keep[1:] = ordered[1:] != ordered[:-1]
    return ordered[keep]


def distinct_rows(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of a 2-D int array in lexicographic order, and each row's place among
    them: np.unique(keys, axis=0, return_inverse=True)'s result by a lexsort of the columns,
    where np.unique sorts the rows as opaque records, several times slower."""
    order = np.lexsort(keys.T[::-1])
    ordered = keys[order]
    new = np.ones(len(ordered), bool)
    new[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    which = np.empty(len(keys), np.int64)
    which[order] = np.cumsum(new) - 1
    return ordered[new], which
