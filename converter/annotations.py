"""Slice args -> one Perfetto DebugAnnotation named "args" carrying the args as JSON text.

trace_processor expands a `legacy_json_value` into typed args (`debug.args.<key>`, nested
dicts and arrays flattened, ints kept as ints), so the raw JSON text read from the input can
be passed through untouched. Transcoding each value into nested DebugAnnotations in Python
measured about 20 us per Kineto kernel; this costs well under 1 us.

trace_processor v52 aborts on a JSON null inside a legacy value, so args holding a null are
re-encoded without it (a null carries no value to show).
"""

from __future__ import annotations

from typing import Callable

import msgspec

from .wire import WIRE_BYTES, length_prefixed, tag

ARGS_ANNOTATION_NAME = "args"
_DEBUG_ANNOTATIONS = tag(4, WIRE_BYTES)   # TrackEvent.debug_annotations
_LEGACY_JSON_VALUE = tag(9, WIRE_BYTES)   # DebugAnnotation.legacy_json_value
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


class ArgsEncoder:
    def __init__(self, name_reference: Callable[[str], bytes]):
        """`name_reference` interns an annotation name and returns its encoded name_iid field."""
        self._name_reference = name_reference
        self._name: bytes = b""

    def encode(self, args) -> bytes:
        """TrackEvent.debug_annotations bytes for a dict or raw JSON object text."""
        if type(args) is dict:
            text = _encode(without_nulls(args))
        else:
            text = bytes(args)
            if text[:1] != b"{":
                return b""  # args that are not an object (null, a list, ...) carry no named values
            if b"null" in text:
                text = _encode(without_nulls(_decode(text)))
        if not self._name:
            self._name = self._name_reference(ARGS_ANNOTATION_NAME)
        return _DEBUG_ANNOTATIONS + length_prefixed(self._name + _LEGACY_JSON_VALUE + length_prefixed(text))


def without_nulls(value):
    if type(value) is dict:
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    if type(value) is list:
        return [without_nulls(item) for item in value if item is not None]
    return value
