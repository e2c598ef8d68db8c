"""The args encoder's cache never changes what a slice's args encode to.

Encoded members are cached by key and JSON text across slices; values that are equal in
Python but not the same JSON (1, 1.0, true; 0.0, -0.0; 1.5, 1.50) or that hold lists and
objects must still encode exactly as a fresh encoder, with nothing cached, encodes them.
"""

from __future__ import annotations

import json
import re

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from converter.outputs import annotations
from converter.outputs.annotations import ArgsEncoder
from converter.outputs.wire import string_field
from converter.tuning import Tuning

# JSON texts of values chosen to collide in a cache keyed by Python equality.
_SCALAR_TEXTS = st.sampled_from(["1", "1.0", "1.00", "true", "false", "0", "0.0", "-0.0", "null", '"1"', '"a.b"',
                                 "1e400", "-1e400", "12345678901234567890", "2.962963", "[]", "{}", "[null]"])
_VALUES = st.recursive(
    _SCALAR_TEXTS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda items: "[" + ", ".join(items) + "]"),
        st.dictionaries(st.sampled_from(["a", "b.c", "d"]), inner, max_size=3).map(
            lambda members: "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in members.items()) + "}")),
    max_leaves=6)
_ARGS = st.lists(st.tuples(st.sampled_from(["Input Dims", "grid", "est. occupancy %", "x"]), _VALUES),
                 min_size=1, max_size=5).map(
    lambda members: ("{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in members) + "}").encode())


def _inline_name(name: str) -> bytes:
    return string_field(10, name)


@settings(max_examples=300, deadline=None)
@given(st.lists(_ARGS, min_size=1, max_size=12))
def test_cached_encoding_equals_a_fresh_encoders(texts):
    shared = ArgsEncoder(_inline_name)
    assert [shared.encode(text) for text in texts] == [ArgsEncoder(_inline_name).encode(text) for text in texts]


def test_equal_values_of_other_types_encode_apart():
    encoder = ArgsEncoder(_inline_name)
    texts = [b'{"n": 1, "x": 0.5}', b'{"n": 1.0, "x": 0.5}', b'{"n": true, "x": 0.5}', b'{"n": -0.0, "x": 0.5}',
             b'{"n": 0.0, "x": 0.5}', b'{"n": [[1], []], "x": 0.5}', b'{"n": [[1.0], []], "x": 0.5}']
    encoded = [encoder.encode(text) for text in texts]
    assert len(set(encoded)) == len(texts)
    assert encoded == [ArgsEncoder(_inline_name).encode(text) for text in texts]


def test_keys_whose_values_never_repeat_leave_the_cache():
    """Kineto writes a fresh "External id" per event: caching those only fills memory (the
    cache once held 100k of them, about 18 MB in the args helper). Once the cache fills, such
    a key is encoded afresh each time, a repeating one stays cached, and every slice still
    encodes as a fresh encoder would."""
    encoder = ArgsEncoder(_inline_name, Tuning(annotation_cache_entries=64))
    texts = [f'{{"External id": {number}, "grid": [1, 2], "kernel": "k{number % 3}", "x": 0.5}}'.encode()
             for number in range(1000)]
    assert [encoder.encode(text) for text in texts] == [ArgsEncoder(_inline_name).encode(text) for text in texts]
    cached_keys = {key for key, _ in encoder._entries}
    assert "External id" not in cached_keys and {"grid", "kernel"} <= cached_keys
    assert len(encoder._entries) < 64
    # An uncached key's plain ints skip decoding; any other value of it (negative, past 18
    # digits, past int64, not an int) still encodes as decoded.
    others = [f'{{"External id": {number}, "grid": [1, 2], "x": 0.5}}'.encode()
              for number in (-5, 10 ** 17, 10 ** 18 - 1, 10 ** 18, 2 ** 63 - 1, 2 ** 63, 2 ** 64, "1.5", '"7"', "[]")]
    assert [encoder.encode(text) for text in others] == [ArgsEncoder(_inline_name).encode(text) for text in others]


def _typed_by_hand(text: bytes) -> bool:
    """The typed path's rule, one entry at a time, as plainly as it can be said."""
    return any(mark in text for mark in (b".", b"\\", b"[]", b"{}", b"null")) or \
        re.search(rb"[0-9][eE]|[0-9]{19}", text) is not None


# Bytes that make up the marks, and the near misses around them ("nul", "e" after a letter, the
# bytes either side of the digits, a Latin-1 superscript two before an "e").
_MARK_BYTES = st.lists(st.sampled_from([b".", b"\\", b"[", b"]", b"{", b"}", b"n", b"u", b"l", b"e", b"E", b"1",
                                        b"0" * 9, b"9" * 10, b"a", b'"', b"\xc3\xa9", b"/", b":", b"\xb2e"]),
                       max_size=6).map(b"".join)


@settings(max_examples=300, deadline=None)
@given(st.lists(_MARK_BYTES, min_size=1, max_size=10), st.integers(1, 40))
@example([b"{", b"}", b"[", b"]", b"nu", b"ll", b"1", b"e", b"0" * 9, b"9" * 10], 40)  # marks across entries
@example([b"a" + b"0" * 9 + b"9" * 9, b"{" + b"0" * 9 + b"9" * 10], 40)  # 18 digits, then 19
def test_a_run_finds_the_typed_entries_the_plain_rule_finds(texts, piece_bytes):
    """Entries are sorted into the two paths all at once, in pieces of the run's text: each
    takes the typed path exactly where the rule says so for its own text (a mark across two
    entries is neither's), however the run is cut."""
    text = np.frombuffer(b"".join(texts), np.uint8)
    bounds = np.cumsum([0, *map(len, texts)])
    pieces = list(annotations._pieces(bounds, piece_bytes))
    assert [first for first, _ in pieces] == [0, *(last for _, last in pieces[:-1])] and pieces[-1][1] == len(texts)
    for first, last in pieces:
        typed = annotations._typed(text[bounds[first]:bounds[last]], bounds[first:last + 1] - bounds[first])
        assert typed.tolist() == [_typed_by_hand(entry) for entry in texts[first:last]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(_ARGS, st.sampled_from([b"null", b"[1]", b"", b'"x"'])), min_size=1, max_size=12),
       st.integers(1, 300))
def test_a_run_encodes_as_its_entries_one_by_one(texts, piece_bytes):
    """A run encoded at once, in pieces of any size, is each entry's encoding back to back, and
    its lengths say where each one is; the annotation names come in the same order."""
    names_alone: list[str] = []
    alone = ArgsEncoder(lambda name: names_alone.append(name) or _inline_name(name))
    one_by_one = [alone.encode(text) for text in texts]
    names_at_once: list[str] = []
    at_once = ArgsEncoder(lambda name: names_at_once.append(name) or _inline_name(name),
                          Tuning(annotation_piece_bytes=piece_bytes))
    encoded = bytearray()
    lengths = at_once.encode_run(b"".join(texts), np.cumsum([0, *map(len, texts)]), encoded)
    assert bytes(encoded) == b"".join(one_by_one)
    assert lengths.tolist() == [len(part) for part in one_by_one]
    assert names_at_once == names_alone
