"""Slice args -> one Perfetto DebugAnnotation named "args" (read back as `debug.args.<key>`).

Two encodings, chosen per slice for speed without losing a bit:
- args without a '.', a backslash, a float, a null, an empty container or a 19-digit number pass
  through as their raw JSON text in
  `legacy_json_value`; trace_processor expands it into typed args (nested dicts and arrays
  flattened, ints kept as ints). A run of entries is sorted into the two kinds at once, by
  numpy passes over its text, and the JSON ones are framed by `map` and `join`, with no
  Python test or framing per entry (which, per entry, cost more than the rest of their
  encoding).
- other args become typed `dict_entries` encoded here: trace_processor's JSON parser rounds
  about 1 in 80 short decimals such as 2.962963 to a neighbouring double, v52 aborts on a
  null, and a '.' inside a key is kept by the JSON path but becomes '_' in typed entries
  ("est. achieved occupancy %" -> "est_ achieved occupancy %"), so any dot takes this path
  and every key reads the same way. Array elements that would store nothing (null, [], {})
  keep their place as JSON text, so later indices do not shift. Kineto kernels repeat most
  (key, value) pairs, so encoded entries are cached: a kernel's dozen args cost a look-up
  each instead of a transcoding.
"""

from __future__ import annotations

from collections import Counter
from itertools import chain
from typing import Callable, Iterator

import msgspec
import numpy as np

from ..model import decode_json
from ..tuning import DEFAULT_TUNING, Tuning
from .fields import DebugAnnotation, TrackEvent
from .wire import WIRE_BYTES, WIRE_FIXED64, WIRE_VARINT, length_prefixed, pack_double, string_field, tag, varint

ARGS_ANNOTATION_NAME = "args"
_DEBUG_ANNOTATIONS = tag(TrackEvent.DEBUG_ANNOTATIONS, WIRE_BYTES)
_BOOL = tag(DebugAnnotation.BOOL_VALUE, WIRE_VARINT)
_UINT = tag(DebugAnnotation.UINT_VALUE, WIRE_VARINT)
_INT = tag(DebugAnnotation.INT_VALUE, WIRE_VARINT)
_DOUBLE = tag(DebugAnnotation.DOUBLE_VALUE, WIRE_FIXED64)
_STRING = DebugAnnotation.STRING_VALUE
_LEGACY_JSON_VALUE = tag(DebugAnnotation.LEGACY_JSON_VALUE, WIRE_BYTES)
_DICT_ENTRIES = tag(DebugAnnotation.DICT_ENTRIES, WIRE_BYTES)
_ARRAY_VALUES = tag(DebugAnnotation.ARRAY_VALUES, WIRE_BYTES)

_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1
_DOT, _BACKSLASH, _BRACKET, _BRACE, _ZERO, _LOWER_E, _NULL_N, _NULL_U, _NULL_L = b".\\[{0enul"
_CLOSING = 2  # "]" and "}" follow "[" and "{" in ASCII
_CASE_BIT = 0x20  # "E" | _CASE_BIT == "e"
# A key holding more than this share of a full cache has values that rarely repeat (Kineto's
# "External id", "correlation", "Ev Idx": one per event): caching them only fills memory.
_UNIQUE_SHARE = 8
_RAW_MEMBERS = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode  # an object's members, values as written
# 19 digits in a row may be an int beyond int64, which trace_processor's JSON parser wraps around:
# a digit, then 18 more of its entry (runs of 1 doubled to 2, 4, 8 and 16, then 2 more).
_LONG_NUMBER_STEPS = (1, 2, 4, 8, 2)
_PLAIN_INT_DIGITS = 18  # digits alone, so below 10**18: an int64, written as `int_value`


def encode_value(value, name_ref: Callable[[str], bytes]) -> bytes:
    """The value fields of a DebugAnnotation; None gives no value (trace_processor skips it).
    `name_ref` interns dict keys: their encoded name_iid field."""
    kind = type(value)
    if kind is int:
        if _INT64_MIN <= value <= _INT64_MAX:
            return _INT + varint(value)
        if 0 <= value <= _UINT64_MAX:
            return _UINT + varint(value)
        return string_field(_STRING, str(value))
    if kind is float:
        return _DOUBLE + pack_double(value)
    if kind is str:
        return string_field(_STRING, value)
    if kind is bool:
        return _BOOL + (b"\x01" if value else b"\x00")
    if kind is dict:
        return b"".join(_entry(key, item, name_ref) for key, item in value.items() if item is not None)
    if kind is list:
        return b"".join(_ARRAY_VALUES + length_prefixed(encode_value(item, name_ref) or _placeholder(item))
                        for item in value)
    return b""


def annotation(name: str, value, name_ref: Callable[[str], bytes]) -> bytes:
    """One TrackEvent.debug_annotations entry named `name`, typed: what a stage adds to a slice
    beside its own "args" (read back as `debug.<name>.<key>`), which stay as read."""
    return _DEBUG_ANNOTATIONS + length_prefixed(name_ref(name) + encode_value(value, name_ref))


def _placeholder(item) -> bytes:
    """trace_processor numbers array elements by the args it stored, so an element that stores
    nothing (null, [], {}) would shift every later index; it is kept as its JSON text instead."""
    return string_field(_STRING, "null" if item is None else "[]" if type(item) is list else "{}")


def _entry(key: str, value, name_ref: Callable[[str], bytes]) -> bytes:
    return _DICT_ENTRIES + length_prefixed(name_ref(key) + encode_value(value, name_ref))


class ArgsEncoder:
    def __init__(self, name_reference: Callable[[str], bytes], tuning: Tuning = DEFAULT_TUNING):
        """`name_reference` interns an annotation name and returns its encoded name_iid field.
        The tuning's annotation_piece_bytes of text are encoded at once: numpy's dozen passes
        over it stay in the cache (a megabyte at once took twice as long a byte), and so do
        the piece's lists."""
        self._name_reference = name_reference
        self._piece_bytes, self._cache_limit = tuning.annotation_piece_bytes, tuning.annotation_cache_entries
        self._name: bytes = b""
        self._json_heads = _JsonHeads(self._json_head)
        self._int_heads: dict[str, bytes] = {}  # key -> its name field and the int tag
        self._entries: dict[tuple[str, bytes], bytes] = {}
        self._uncached_keys: set[str] = set()

    def encode(self, text: bytes) -> bytes:
        """TrackEvent.debug_annotations bytes for raw JSON object text: encode_run for one
        entry, which costs numpy's fixed costs (tens of us); many go through encode_run."""
        text = bytes(text)
        encoded = bytearray()
        self.encode_run(text, np.array([0, len(text)], np.int64), encoded)
        return bytes(encoded)

    def encode_run(self, text: bytes, bounds: np.ndarray, encoded: bytearray) -> np.ndarray:
        """Entries back to back in `text` (entry i is text[bounds[i]:bounds[i + 1]]) each
        encoded as `encode` does, appended to `encoded`; each one's length. The typed path
        interns keys in entry order, so iids do not depend on how entries are grouped into
        runs."""
        if not self._name and len(bounds) > 1:
            self._name = self._name_reference(ARGS_ANNOTATION_NAME)
        raw = np.frombuffer(text, np.uint8)
        lengths = [np.zeros(0, np.int64)]
        for first, last in _pieces(bounds, self._piece_bytes):
            piece, piece_lengths = self._encode_piece(text, raw, bounds[first:last + 1])
            encoded += piece
            lengths.append(piece_lengths)
        return np.concatenate(lengths)

    def _encode_piece(self, text: bytes, raw: np.ndarray, bounds: np.ndarray) -> tuple[bytes, np.ndarray]:
        """encode_run's work on a few hundred KB of its text. Args that are not an object
        (null, a list, ...) carry no named values: no bytes."""
        starts, ends = bounds[:-1], bounds[1:]
        objects = ends > starts
        objects[objects] = raw[starts[objects]] == _BRACE
        typed = objects & _typed(raw[bounds[0]:bounds[-1]], bounds - bounds[0])
        heads = list(map(self._json_heads.__getitem__, (ends - starts).tolist()))
        bodies = list(map(text.__getitem__, map(slice, starts.tolist(), ends.tolist())))
        for index in np.flatnonzero(~objects).tolist():
            heads[index] = bodies[index] = b""
        for index in np.flatnonzero(typed).tolist():
            heads[index], bodies[index] = b"", self._typed_annotation(bodies[index])
        lengths = np.fromiter(map(len, heads), np.int64, len(heads)) + np.fromiter(map(len, bodies), np.int64,
                                                                                   len(bodies))
        return b"".join(chain.from_iterable(zip(heads, bodies))), lengths

    def _typed_annotation(self, text: bytes) -> bytes:
        try:
            value = self._typed_entries(_RAW_MEMBERS(text))
        except RecursionError:  # nested hundreds of levels deep: keep it whole, as JSON text
            value = string_field(_STRING, text.decode())
        return _DEBUG_ANNOTATIONS + length_prefixed(self._name + value)

    def _json_head(self, length: int) -> bytes:
        """The fields before JSON text `length` bytes long, in an annotation of it: they depend
        on nothing else, so each length's are made once (their framing was a third of the
        untyped path)."""
        inner = self._name + _LEGACY_JSON_VALUE + varint(length)
        return _DEBUG_ANNOTATIONS + varint(len(inner) + length) + inner

    def _typed_entries(self, members: dict[str, msgspec.Raw]) -> bytes:
        """Each member's entry, cached by its key and its JSON text: equal text is an equal
        value of the same type (1, 1.0 and true differ, and so do 0.0 and -0.0), and a value
        holding lists (Kineto's "Input Dims") is cached like any other. Keys whose values
        turned out not to repeat are encoded afresh each time instead, a plain int of theirs
        (Kineto's "External id", "Ev Idx") without decoding it: a tenth of the typed path."""
        cache, uncached, limit = self._entries, self._uncached_keys, self._cache_limit
        parts = []
        for key, raw in members.items():
            text = bytes(raw)
            if key in uncached and text.isdigit() and len(text) <= _PLAIN_INT_DIGITS:
                head = self._int_heads.get(key)
                if head is None:
                    head = self._int_heads[key] = self._name_reference(key) + _INT
                parts.append(_DICT_ENTRIES + length_prefixed(head + varint(int(text))))
                continue
            cache_key = (key, text)
            encoded = cache.get(cache_key)
            if encoded is None:
                value = decode_json(raw)
                encoded = _entry(key, value, self._name_reference) if value is not None else b""
                if len(cache) >= limit:
                    self._forget()
                if key not in uncached:
                    cache[cache_key] = encoded
            parts.append(encoded)
        return b"".join(parts)

    def _forget(self) -> None:
        """Empty the full cache, and stop caching the keys that filled most of it."""
        held = Counter(key for key, _ in self._entries)
        self._uncached_keys.update(key for key, entries in held.items() if entries * _UNIQUE_SHARE > self._cache_limit)
        self._entries.clear()


class _JsonHeads(dict[int, bytes]):
    """Each text length's head, made on first use: looked up by `map`, without a Python call a
    slice."""

    def __init__(self, make: Callable[[int], bytes]):
        super().__init__()
        self._make = make

    def __missing__(self, length: int) -> bytes:
        head = self[length] = self._make(length)
        return head


def _pieces(bounds: np.ndarray, piece_bytes: int) -> Iterator[tuple[int, int]]:
    """Entries first .. last - 1 of about `piece_bytes` of text (or one longer entry) at a time."""
    first, count = 0, len(bounds) - 1
    while first < count:
        last = int(np.searchsorted(bounds, bounds[first] + piece_bytes, "right")) - 1
        last = min(max(last, first + 1), count)
        yield first, last
        first = last


def _typed(text: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Per entry of `text` (entry i is text[bounds[i]:bounds[i + 1]]), whether it holds what
    sends args to the typed path: trace_processor's JSON parser keeps escapes (\\n, \\u00e9) as
    literal text, wraps ints beyond int64 around, rounds some decimals, aborts on a null and
    turns a '.' in a key into '_'. So: a '.', a backslash, "[]", "{}", "null", a digit before
    'e' or 'E' (an exponent float, or a string that looks like one, which only costs the typed
    path) or 19 digits in a row."""
    typed = np.zeros(len(bounds) - 1, bool)
    present = np.flatnonzero(bounds[1:] > bounds[:-1])  # an empty entry holds nothing
    if len(present):
        typed[present] = np.logical_or.reduceat(_marks(text, bounds), bounds[present])
    return typed


def _marks(text: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Per byte of `text` (non-empty), whether one of _typed's marks begins there and ends in
    the same entry."""
    joined = np.ones(len(text), bool)  # byte i is in the entry byte i - 1 is in
    later_starts = bounds[1:-1]
    joined[later_starts[later_starts < len(text)]] = False
    marks = (text == _DOT) | (text == _BACKSLASH)
    head, tail, next_joined = text[:-1], text[1:], joined[1:]
    marks[:-1] |= (head == _BRACKET) & (tail == _BRACKET + _CLOSING) & next_joined
    marks[:-1] |= (head == _BRACE) & (tail == _BRACE + _CLOSING) & next_joined
    digits = (text - _ZERO) < 10  # below "0" wraps around
    marks[:-1] |= digits[:-1] & ((tail | _CASE_BIT) == _LOWER_E) & next_joined
    nu = (head == _NULL_N) & (tail == _NULL_U) & next_joined
    marks[:-3] |= nu[:-2] & (text[2:-1] == _NULL_L) & next_joined[1:-1] & (text[3:] == _NULL_L) & next_joined[2:]
    following = (digits & joined)[1:]  # following[i]: byte i + 1 is a digit of byte i's entry
    for step in _LONG_NUMBER_STEPS:  # following[i]: bytes i + 1 .. i + 18 are
        following = following[:-step] & following[step:]
    marks[:len(following)] |= digits[:len(following)] & following
    return marks
