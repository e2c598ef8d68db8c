"""Slice args -> Perfetto DebugAnnotation bytes, keeping nesting and value types.

Kineto kernels carry a dozen args each, most of them repeating (device, stream, grid,
block, ...), so encoded (key, value) pairs are cached; only the unique ids cost real work.
"""

from __future__ import annotations

from typing import Callable

import msgspec

from .wire import bytes_field, double_field, string_field, varint_field

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_UINT64_MAX = (1 << 64) - 1
_CACHE_LIMIT = 200_000
_DECODE = msgspec.json.Decoder().decode

# DebugAnnotation field numbers (perfetto/trace/track_event/debug_annotation.proto).
NAME_IID, NAME = 1, 10
BOOL_VALUE, UINT_VALUE, INT_VALUE, DOUBLE_VALUE, STRING_VALUE = 2, 3, 4, 5, 6
LEGACY_JSON_VALUE = 9
DICT_ENTRIES, ARRAY_VALUES = 11, 12
TRACK_EVENT_DEBUG_ANNOTATIONS = 4


def encode_value(value) -> bytes:
    """The value part of a DebugAnnotation (no name)."""
    kind = type(value)
    if kind is int:
        if _INT64_MIN <= value <= _INT64_MAX:
            return varint_field(INT_VALUE, value)
        if 0 <= value <= _UINT64_MAX:
            return varint_field(UINT_VALUE, value)
        return string_field(STRING_VALUE, str(value))
    if kind is str:
        return string_field(STRING_VALUE, value)
    if kind is float:
        return double_field(DOUBLE_VALUE, value)
    if kind is bool:
        return varint_field(BOOL_VALUE, int(value))
    if kind is dict:
        return b"".join(
            bytes_field(DICT_ENTRIES, string_field(NAME, str(key)) + encode_value(item))
            for key, item in value.items())
    if kind is list:
        return b"".join(bytes_field(ARRAY_VALUES, encode_value(item)) for item in value)
    # null: an annotation with a name and no value.
    return b""


class AnnotationEncoder:
    """Encodes an args mapping as TrackEvent.debug_annotations with interned names."""

    def __init__(self, intern_name: Callable[[str], int]):
        self._intern_name = intern_name
        self._names: dict[str, bytes] = {}
        self._pairs: dict[tuple, bytes] = {}

    def encode(self, args) -> bytes:
        if args is None:
            return b""
        if type(args) is not dict:
            args = _DECODE(args)
        pairs = self._pairs
        out = []
        for key, value in args.items():
            kind = type(value)
            cache_key = (key, value) if kind is int or kind is str else (
                (key, tuple(value)) if kind is list and _scalars(value) else None)
            if cache_key is not None:
                encoded = pairs.get(cache_key)
                if encoded is None:
                    encoded = self._encode_pair(key, value)
                    if len(pairs) >= _CACHE_LIMIT:
                        pairs.clear()
                    pairs[cache_key] = encoded
            else:
                encoded = self._encode_pair(key, value)
            out.append(encoded)
        return b"".join(out)

    def _encode_pair(self, key: str, value) -> bytes:
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = varint_field(NAME_IID, self._intern_name(key))
        payload = name + encode_value(value)
        return bytes_field(TRACK_EVENT_DEBUG_ANNOTATIONS, payload)


def _scalars(values: list) -> bool:
    return all(type(item) is int or type(item) is str for item in values)
