"""Slice args -> one Perfetto DebugAnnotation named "args" (read back as `debug.args.<key>`).

Two encodings, chosen per slice for speed without losing a bit:
- args without a '.', a float, a null or an empty container pass through as their raw JSON text in
  `legacy_json_value`; trace_processor expands it into typed args (nested dicts and arrays
  flattened, ints kept as ints). This costs well under 1 us a slice.
- other args become typed `dict_entries` encoded here: trace_processor's JSON parser rounds
  about 1 in 80 short decimals such as 2.962963 to a neighbouring double, v52 aborts on a
  null, and a '.' inside a key is kept by the JSON path but becomes '_' in typed entries
  ("est. achieved occupancy %" -> "est_ achieved occupancy %"), so any dot takes this path
  and every key reads the same way. Array elements that would store nothing (null, [], {})
  keep their place as JSON text, so later indices do not shift. Kineto kernels repeat most (key, value) pairs, so encoded
  entries are cached: a dozen args cost a few us instead of the 20 us of naive transcoding.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Optional

import msgspec

from ..model import decode_json
from .wire import WIRE_BYTES, WIRE_FIXED64, WIRE_VARINT, length_prefixed, pack_double, string_field, tag, varint

ARGS_ANNOTATION_NAME = "args"
_DEBUG_ANNOTATIONS = tag(4, WIRE_BYTES)   # TrackEvent.debug_annotations
# DebugAnnotation fields.
_BOOL = tag(2, WIRE_VARINT)
_UINT = tag(3, WIRE_VARINT)
_INT = tag(4, WIRE_VARINT)
_DOUBLE = tag(5, WIRE_FIXED64)
_STRING = 6
_LEGACY_JSON_VALUE = tag(9, WIRE_BYTES)
_NAME = 10
_DICT_ENTRIES = tag(11, WIRE_BYTES)
_ARRAY_VALUES = tag(12, WIRE_BYTES)

_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1
# A digit before 'e' or 'E' marks an exponent float (or a string that merely looks like one,
# which only costs the typed path). bytes.translate + `in` measured 4x faster than a regex.
_EXPONENT_MARKS = bytes(
    0x44 if chr(code).isdigit() else 0x65 if chr(code) in "eE" else 0x20 for code in range(256))
_CACHE_LIMIT = 20_000
# A key holding more than this share of a full cache has values that rarely repeat (Kineto's
# "External id", "correlation", "Ev Idx": one per event): caching them only fills memory.
_UNIQUE_SHARE = 8
_RAW_MEMBERS = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode  # an object's members, values as written
# 19 digits in a row may be an int beyond int64, which trace_processor's JSON parser wraps around.
_LONG_NUMBER = b"D" * 19
_PLAIN_INT_DIGITS = 18  # digits alone, so below 10**18: an int64, written as `int_value`


def encode_value(value, name_ref: Optional[Callable[[str], bytes]] = None) -> bytes:
    """The value fields of a DebugAnnotation; None gives no value (trace_processor skips it).
    `name_ref` interns dict keys (name_iid) instead of writing them inline."""
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


def _placeholder(item) -> bytes:
    """trace_processor numbers array elements by the args it stored, so an element that stores
    nothing (null, [], {}) would shift every later index; it is kept as its JSON text instead."""
    return string_field(_STRING, "null" if item is None else "[]" if type(item) is list else "{}")


def _entry(key: str, value, name_ref: Optional[Callable[[str], bytes]] = None) -> bytes:
    name = string_field(_NAME, key) if name_ref is None else name_ref(key)
    return _DICT_ENTRIES + length_prefixed(name + encode_value(value, name_ref))


class ArgsEncoder:
    def __init__(self, name_reference: Callable[[str], bytes]):
        """`name_reference` interns an annotation name and returns its encoded name_iid field."""
        self._name_reference = name_reference
        self._name: bytes = b""
        self._json_heads: dict[int, bytes] = {}  # text length -> what goes before JSON text that long
        self._int_heads: dict[str, bytes] = {}  # key -> its name field and the int tag
        self._entries: dict[tuple[str, bytes], bytes] = {}
        self._uncached_keys: set[str] = set()

    def encode(self, text: bytes) -> bytes:
        """TrackEvent.debug_annotations bytes for raw JSON object text."""
        if not self._name:
            self._name = self._name_reference(ARGS_ANNOTATION_NAME)
        text = bytes(text)
        if text[:1] != b"{":
            return b""  # args that are not an object (null, a list, ...) carry no named values
        # trace_processor's JSON parser keeps escapes (\n, \\, \u00e9) as literal text and wraps
        # ints beyond int64 around: such args take the typed path. The likeliest reason first
        # (Kineto's "Input Dims" of scalars, then a dot): most typed args stop at one test.
        if b"[]" not in text and b"." not in text and b"null" not in text and b"{}" not in text \
                and b"\\" not in text:
            marks = text.translate(_EXPONENT_MARKS)
            if b"De" not in marks and _LONG_NUMBER not in marks:
                head = self._json_heads.get(len(text))
                if head is None:
                    head = self._json_heads[len(text)] = self._json_head(len(text))
                return head + text
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
        cache, uncached = self._entries, self._uncached_keys
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
                if len(cache) >= _CACHE_LIMIT:
                    self._forget()
                if key not in uncached:
                    cache[cache_key] = encoded
            parts.append(encoded)
        return b"".join(parts)

    def _forget(self) -> None:
        """Empty the full cache, and stop caching the keys that filled most of it."""
        held = Counter(key for key, _ in self._entries)
        self._uncached_keys.update(key for key, entries in held.items() if entries * _UNIQUE_SHARE > _CACHE_LIMIT)
        self._entries.clear()
