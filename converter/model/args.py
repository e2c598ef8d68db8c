"""Slice args as the model holds them: raw JSON object text in a store, one int per slice.

Args are about half of a Kineto trace and are only needed again when written, so the model
never decodes them. A store hands out a reference per entry and gives the text back, alone
or many at once in one pass (`sweep`). Where the text lives (memory, a temporary file) and
whether something prepares it ahead for a writer is the store's business: the job picks a
store, the reader fills it, every consumer asks the same questions.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator, Optional, Protocol, Sequence

import msgspec
import numpy as np


class LabelRule(Protocol):
    """`label`: a label read from an entry's args text (None: none); `marker`: text (not
    empty) that every entry it labels holds, so a store may look for it in many entries'
    text at once and read labels only where it is."""

    @property
    def label(self) -> Callable[[bytes], Optional[str]]:
        ...

    @property
    def marker(self) -> bytes:
        ...


_decode = msgspec.json.Decoder().decode
_decode_lenient = msgspec.json.Decoder(float_hook=float).decode  # 1e400 -> inf, not "Number out of range"
_encode = msgspec.json.Encoder().encode
_INFINITY = (msgspec.Raw(b"-1e999"), msgspec.Raw(b"1e999"))  # decode_json reads these back as -inf, inf


def decode_json(text: bytes) -> Any:
    """Any JSON value: numbers beyond double range become +-inf, ints of thousands of digits
    (more than int() takes) stay text."""
    try:
        return _decode(text)
    except msgspec.ValidationError:
        try:
            return _decode_lenient(text)
        except msgspec.ValidationError:  # "Integer value out of range"
            import json  # only for such ints: a start that loads it for nothing costs every command

            return json.loads(bytes(text), parse_int=_int_or_text)


def _int_or_text(digits: str) -> Any:
    return int(digits) if len(digits) <= 4000 else digits


def encode_json(value: Any) -> bytes:
    """JSON text that `decode_json` reads back as `value` (infinities included)."""
    return _encode(_finite(value))


def _finite(value: Any) -> Any:
    kind = type(value)
    if kind is float and math.isinf(value):
        return _INFINITY[value > 0]
    if kind is dict:
        return {key: _finite(item) for key, item in value.items()}
    if kind is list:
        return [_finite(item) for item in value]
    return value


class PreparedArgs(Protocol):
    """Entries already encoded for one writer (see ArgsStore.prepared). `interned`: strings the
    encoded bytes refer to by position (iid = position + 1), for the writer to intern first
    (None: an iid kept for a name no entry refers to, which the writer need not write)."""

    interned: list[Optional[str]]

    def runs(self, references: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(the entries' bytes, where each reference's entry starts there, its length), for
        an array of references (-1: none, length 0)."""

    def release_pages(self) -> None:
        """Let the pages of the entries read so far go, where they are a mapped file's (they
        count in the process's memory once read); the writer calls it every few hundred runs."""


class ArgsStore:
    """Raw JSON args, kept in memory; the base of every store.

    `prepared(form)` returns entries already encoded in a writer's form where a store made
    them ahead (None here: the writer encodes). `labels` applies a label rule to entries,
    again taking what a store computed ahead with that same rule."""

    def __init__(self) -> None:
        self._texts: list[bytes] = []
        self._prepared: dict[str, PreparedArgs] = {}

    def __len__(self) -> int:
        return len(self._texts)

    def add(self, text: Any) -> int:
        """Store bytes-like `text`; the reference is an int."""
        return self.add_many([text])

    def add_many(self, texts: list[Any]) -> int:
        """Store every text of `texts`; their references are consecutive, from the one returned."""
        first = len(self._texts)
        self._texts.extend(map(bytes, texts))
        return first

    def text(self, reference: int) -> bytes:
        return self._texts[reference]

    def sweep(self, references: Sequence[int]) -> Iterator[bytes]:
        """The texts of ascending `references`, in that order."""
        return (self._texts[reference] for reference in references)

    def texts(self, references: list[int]) -> list[Optional[bytes]]:
        """The texts of `references` (negative: no args, None) in their order, read in one sweep."""
        return self._in_order(references, lambda text: text)

    def labels(self, references: list[int], rule: LabelRule) -> list[Optional[str]]:
        """rule.label(text) for `references` (negative: no args, no label), in their order; only the
        labels are kept, never all the texts at once."""
        return self._in_order(references, rule.label)

    def _in_order(self, references: list[int], apply: Callable[[bytes], Any]) -> list[Any]:
        """apply(text) per reference, the store swept once in reference order (a stable sort:
        equal references in their order)."""
        found: list[Any] = [None] * len(references)
        wanted = np.asarray(references, np.int64)
        order = np.argsort(wanted, kind="stable")
        order = order[wanted[order] >= 0]
        for position, text in zip(order.tolist(), self.sweep(wanted[order].tolist())):
            found[position] = apply(text)
        return found

    def prepared(self, form: str) -> Optional[PreparedArgs]:
        """Every entry encoded in `form` (a writer's name for its encoding), or None."""
        return self._prepared.get(form)

    def keep_prepared(self, form: str, prepared: PreparedArgs) -> None:
        """Keep what a writer prepared itself, for the next file written from the same store."""
        self._prepared[form] = prepared



class ExtraArgs(msgspec.Struct):
    """Args a stage derives about slices, written beside their own and never into them (a
    merge's collective figures, each GPU slice's launch attribution): row `rows[i]` (sorted,
    distinct) carries `values[which[i]]` (annotation name -> value). Rows share few distinct
    values, so a writer encodes each once, whatever the number of rows."""

    rows: np.ndarray
    which: np.ndarray
    values: list[dict[str, Any]]

    @classmethod
    def none(cls) -> "ExtraArgs":
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), [])

    @classmethod
    def per_row(cls, entries: dict[int, dict[str, Any]]) -> "ExtraArgs":
        """A value of its own for each row."""
        rows = np.fromiter(sorted(entries), np.int64, len(entries))
        return cls(rows, np.arange(len(rows), dtype=np.int64), [entries[row] for row in rows.tolist()])

    def renumbered(self, new_rows: np.ndarray) -> "ExtraArgs":
        """On the rows a trace's slices have once some are dropped (`new_rows`: per old row, its
        new one, -1 where dropped; in order, so the rows stay sorted)."""
        moved = new_rows[self.rows] if len(self.rows) else self.rows
        kept = moved >= 0
        return ExtraArgs(moved[kept], self.which[kept], self.values)

    def joined(self, other: "ExtraArgs") -> "ExtraArgs":
        """Both rows' args; a row in both carries both (other's names last)."""
        rows = np.union1d(self.rows, other.rows)
        mine, theirs = (_position(given.rows, rows) for given in (self, other))
        values = self.values + other.values
        which = np.where(mine >= 0, self.which[np.maximum(mine, 0)] if len(self.rows) else -1,
                         len(self.values) + (other.which[np.maximum(theirs, 0)] if len(other.rows) else -1))
        for index in np.flatnonzero((mine >= 0) & (theirs >= 0)).tolist():
            values.append({**self.values[self.which[mine[index]]], **other.values[other.which[theirs[index]]]})
            which[index] = len(values) - 1
        return ExtraArgs(rows, which, values)


def _position(sorted_rows: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per row of `rows`, its position in `sorted_rows`, -1 where absent."""
    if not len(sorted_rows):
        return np.full(len(rows), -1, np.int64)
    at = np.minimum(np.searchsorted(sorted_rows, rows), len(sorted_rows) - 1)
    return np.where(sorted_rows[at] == rows, at, -1)
