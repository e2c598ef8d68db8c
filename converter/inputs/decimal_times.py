"""Times as a JSON file writes them (decimal microseconds) -> exact integer nanoseconds, in bulk.

Real Kineto traces write times such as 4458676522690.655 us: beyond 2**40 us a float no
longer holds them to the nanosecond, and most real traces are beyond it (their clocks count
from boot or from the epoch). The digits themselves are exact, so a run of times is parsed
from its text at once with numpy. Times as profilers write them, digits with 3 decimals or
none, are read a column at a time for all texts of one length (Horner's rule); the rest,
one pass over their joined characters, each digit weighted by its place. A time with more
than 3 decimals, an exponent or more than 19 digits is converted alone through
Decimal, rounded half to even. Times msgspec decoded as numbers are converted in bulk too,
where exact. Both give ns as an int64 column and where each is known, so a reader checks a
whole run of events' times at once.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any, Optional, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

_DIGITS_MAX = 19  # below 10**19 ns fits uint64
_POWERS = np.array([10 ** k for k in range(_DIGITS_MAX)], dtype=np.uint64)
_ZERO, _NINE, _DOT, _MINUS, _COMMA = ord("0"), ord("9"), ord("."), ord("-"), ord(",")
_INFINITIES = (float("inf"), float("-inf"))
_USUAL_NS_DIGITS = 18  # the usual path's sums stay below 10**18, inside int64
_USUAL_WIDTH = _USUAL_NS_DIGITS + 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
# Floats carry ns exactly only below 2**40 us (~12 days) of relative time.
FLOAT_EXACT_LIMIT_US = float(1 << 40)
_INT_MICROS_MAX = _INT64_MAX // 1000


def exact_ns(texts: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Each text (bytes-like: a JSON number of microseconds) in ns, and whether it is known:
    a finite number whose ns fit int64 (where not, 0)."""
    count = len(texts)
    chars, starts, lengths = _joined(texts)
    values = np.zeros(count, np.int64)
    usual = np.zeros(count, bool)
    for width in np.flatnonzero(np.bincount(lengths)).tolist():
        if 0 < width <= _USUAL_WIDTH:
            rows = np.flatnonzero(lengths == width)
            values[rows], usual[rows] = _usual_ns(chars, starts[rows], width)
    unusual = np.flatnonzero(~usual).tolist()
    for index, value in zip(unusual, _any_exact_ns([texts[index] for index in unusual]) if unusual else []):
        if value is not None and _INT64_MIN <= value <= _INT64_MAX:
            values[index], usual[index] = value, True
    return values, usual


def _joined(texts: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The texts' characters back to back, each text's start and length there. Joined with
    commas, which no JSON number holds, so the lengths come from where the commas are (a
    len() per text was a large share of exact_ns); where a text holds one, the lengths are taken
    one by one instead."""
    chars = np.frombuffer(b",".join(texts), dtype=np.uint8)
    commas = np.flatnonzero(chars == _COMMA)
    if len(commas) == len(texts) - 1:
        starts = np.concatenate(([0], commas + 1))
        return chars, starts, np.concatenate((commas, [len(chars)])) - starts
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    starts = np.cumsum(lengths + 1) - lengths - 1
    return chars, starts, lengths


def numbers_ns(numbers: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Microseconds as msgspec decodes them (int or float) in ns, and whether known: an int
    whose ns fit int64, a float below 2**40 us, where it holds the ns exactly (elsewhere 0;
    the caller converts those one by one)."""
    count = len(numbers)
    if set(map(type, numbers)) == {int}:  # e.g. epoch microseconds written as ints
        try:
            micros = np.fromiter(numbers, np.int64, count)
            known = (-_INT_MICROS_MAX <= micros) & (micros <= _INT_MICROS_MAX)
        except OverflowError:
            known = np.fromiter((abs(number) <= _INT_MICROS_MAX for number in numbers), bool, count)
            micros = np.array([number if fits else 0 for number, fits in zip(numbers, known.tolist())], np.int64)
        return np.where(known, micros, 0) * 1000, known
    try:
        floats = np.fromiter(numbers, np.float64, count)
    except OverflowError:  # an int beyond any float
        floats = np.array([float(number) if -FLOAT_EXACT_LIMIT_US < number < FLOAT_EXACT_LIMIT_US else np.inf
                           for number in numbers], np.float64)
    known = (-FLOAT_EXACT_LIMIT_US < floats) & (floats < FLOAT_EXACT_LIMIT_US)
    # Rounding half to even, as round() does; the product is the float Python computes too.
    return np.rint(np.where(known, floats, 0.0) * 1000).astype(np.int64), known


def _usual_ns(chars: np.ndarray, starts: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(ns, whether usual) of texts of one width: digits with at most 3 decimals and at most
    18 digits of ns, so no sum leaves int64. The texts with the same number of decimals are
    one matrix of digits, each column weighted by its place (a matrix product)."""
    decimals = np.zeros(len(starts), np.int64)
    for places in range(1, min(3, width - 2) + 1):
        decimals[chars[starts + width - 1 - places] == _DOT] = places
    # Rows of a view of every `width` characters in a row (no index per character); a
    # character that is not a digit wraps to above 9.
    digits = sliding_window_view(chars, width)[starts] - np.uint8(_ZERO)
    values = np.zeros(len(starts), np.int64)
    usual = np.zeros(len(starts), bool)
    counted = np.bincount(decimals)
    for places in np.flatnonzero(counted).tolist():
        columns = np.arange(width)
        if places:  # the dot's column counts for nothing
            columns = np.delete(columns, width - 1 - places)
        if len(columns) - places + 3 > _USUAL_NS_DIGITS:
            continue
        rows = np.flatnonzero(decimals == places) if counted[places] < len(starts) else slice(None)
        texts = digits[rows][:, columns]
        usual[rows] = (texts <= 9).all(axis=1)
        weights = _POWERS[len(columns) - 1 - np.arange(len(columns)) + 3 - places].astype(np.int64)
        values[rows] = texts.astype(np.int64) @ weights
    return np.where(usual, values, 0), usual


def _any_exact_ns(texts: list[Any]) -> list[Optional[int]]:
    """exact_ns of texts of any form, one pass over all their characters."""
    count = len(texts)
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=count)
    if not lengths.all():  # an empty text (never a JSON number): no character to start a sum at
        return [_decimal_ns(bytes(text)) for text in texts]
    chars = np.frombuffer(b"".join(texts), dtype=np.uint8)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    owner = np.repeat(np.arange(count), lengths)
    position = np.arange(len(chars))
    digit = (chars >= _ZERO) & (chars <= _NINE)
    dot = chars == _DOT
    minus = chars == _MINUS
    odd = np.bincount(owner[~(digit | dot | minus)], minlength=count) > 0     # exponents, letters, quotes
    odd |= np.bincount(owner[dot], minlength=count) > 1
    odd |= np.bincount(owner[minus & (position != starts[owner])], minlength=count) > 0
    dot_at = np.full(count, -1, dtype=np.int64)
    dot_at[owner[dot]] = position[dot]
    decimals = np.where(dot_at >= 0, ends - dot_at - 1, 0)
    odd |= decimals > 3
    digits = np.bincount(owner[digit], minlength=count)
    odd |= (digits == 0) | (digits - decimals + 3 > _DIGITS_MAX)
    # A digit's place: the digits after it in its number, plus the zeros up to 3 decimals.
    places = ends[owner] - 1 - position - (dot_at[owner] > position) + 3 - decimals[owner]
    places = np.where(digit & ~odd[owner], places, 0)
    weights = np.where(digit & ~odd[owner], chars - _ZERO, 0).astype(np.uint64) * _POWERS[places]
    magnitudes = np.add.reduceat(weights, starts).tolist()
    negative = (chars[starts] == _MINUS).tolist()
    return [_decimal_ns(bytes(text)) if is_odd else -magnitude if is_negative else magnitude
            for text, magnitude, is_negative, is_odd in zip(texts, magnitudes, negative, odd.tolist())]


def to_ns(value: Any) -> Optional[int]:
    """Microseconds (int, float or Decimal) -> integer nanoseconds, rounding half to even."""
    kind = type(value)
    if kind is int:
        return value * 1000
    if kind is float:
        if value != value or value in _INFINITIES:
            return None
        scaled = value * 1000
        # Beyond 1.8e305 us the product is infinite; the exact int is far out of range all the same.
        return int(value) * 1000 if scaled in _INFINITIES else round(scaled)
    if kind is Decimal:
        if not value.is_finite():
            return None
        return int((value * 1000).to_integral_value())
    return None


def _decimal_ns(text: bytes) -> Optional[int]:
    try:
        return to_ns(Decimal(text.decode("ascii")))
    except (InvalidOperation, UnicodeDecodeError):  # not a number: "null", '"5"', ...
        return None
