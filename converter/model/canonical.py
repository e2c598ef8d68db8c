"""One canonical order for a trace just read, that depends only on what its events say.

Chrome JSON gives meaning to the order of few events (B/E events of one thread, async events of
one id: the reader pairs them as stacks), yet everything after the reader numbers by first
occurrence and breaks ties by row: ids claimed, tracks, texts, slices at equal times, arrows.
So once all events are read the model is put in an order made from content alone (the
builder claims ids in this module's order of source ids, `order_slices` sorts the rows and
renumbers texts and tracks), and every later stage sees the same model whatever order the
exporter wrote.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from .args import ArgsStore
from .slices import SliceTable

if TYPE_CHECKING:
    from .trace import CounterSample, Track


_TYPE_RANKS = {int: 0, float: 1, str: 2}


def source_key(value: Any) -> tuple[int, Any]:
    """A sort key for an input's id (a pid, a tid, a flow or async id): ints, then floats,
    then text, each in its own order, so ids of mixed types still compare."""
    rank = _TYPE_RANKS.get(type(value), 2)
    return rank, value if rank < 2 else str(value)


def ranks(values: Sequence[Any], key: Any = None) -> np.ndarray:
    """Per value, its place among the values sorted (by `key`): a code that orders as they do."""
    order = sorted(range(len(values)), key=(lambda index: values[index]) if key is None
                   else (lambda index: key(values[index])))
    placed = np.empty(len(values), np.int64)
    placed[order] = np.arange(len(values))
    return placed


def order_slices(table: SliceTable, tracks: list["Track"], args: ArgsStore) -> None:
    """Texts numbered in text order, tracks in the order of `tracks` (every track of the table,
    in its canonical order), and the rows sorted by (start, track, duration, name, category,
    instant, args text): a total order of content, so slices that tie on all of it are alike."""
    texts = sorted(table.texts)
    table.renumber(texts, tracks)
    starts = table.ts
    # Starts are nearly sorted in a Kineto file: a stable sort of them is cheap, and only the rows
    # that share a start are sorted by the rest.
    order = np.argsort(starts, kind="stable")
    ordered = starts[order]
    tied = np.zeros(len(order), bool)
    if len(order) > 1:
        same = ordered[1:] == ordered[:-1]
        tied[1:] |= same
        tied[:-1] |= same
    at = np.flatnonzero(tied)
    if len(at):
        rows = order[at]
        columns = (table.instant[rows], table.cat[rows], table.name[rows], table.dur[rows], table.track[rows],
                   ordered[at])
        rows = rows[np.lexsort(columns)]
        order[at] = _by_args_text(rows, table, args)
    if (order[1:] < order[:-1]).any():  # not already in order
        table.permute(order)


def _by_args_text(rows: np.ndarray, table: SliceTable, args: ArgsStore) -> np.ndarray:
    """`rows` (sorted by every column but args), with each run that ties on all of them sorted
    by args text (none first)."""
    keys = np.stack([table.ts[rows], table.track[rows], table.dur[rows], table.name[rows], table.cat[rows],
                     table.instant[rows].astype(np.int64)])
    same = np.all(keys[:, 1:] == keys[:, :-1], axis=0)
    references = table.args[rows]
    # Only runs whose rows hold different args references can be out of order.
    differs = same & (references[1:] != references[:-1])
    if not differs.any():
        return rows
    run_starts = np.flatnonzero(np.concatenate(([True], ~same)))
    run_of = np.cumsum(np.concatenate(([True], ~same))) - 1
    wanted = np.unique(run_of[1:][differs])
    bounds = np.append(run_starts, len(rows))
    picked = np.concatenate([np.arange(bounds[run], bounds[run + 1]) for run in wanted.tolist()])
    texts = args.texts(references[picked].tolist())
    order = sorted(range(len(picked)), key=lambda index: (int(run_of[picked[index]]), _text_key(texts[index])))
    result = rows.copy()
    result[picked] = rows[picked[order]]
    return result


def _text_key(text: Optional[bytes]) -> bytes:
    return b"" if text is None else b"\x01" + text


def order_counters(samples: list["CounterSample"], place: dict["Track", int]) -> None:
    """Samples by track (its place), time and value: two samples of one counter at one time
    come in one order whatever the input's."""
    samples.sort(key=lambda sample: (place[sample.track], sample.ts, sample.value))

