"""Protobuf wire-format primitives, written by hand because they run once per value encoded.

Building message objects in Python costs many times what appending pre-encoded tags and
varints to a bytearray does, per slice. Whole columns of packets are
encoded by packets.py; these serve descriptors, interned data and args.
"""

import struct

_VARINT_CACHE_LIMIT = 1 << 14
pack_double = struct.Struct("<d").pack  # a double's 8 little-endian bytes
_PAIRS = struct.Struct("2s" * _VARINT_CACHE_LIMIT)  # a table's bytes, cut into 2-byte objects

WIRE_VARINT = 0
WIRE_FIXED64 = 1
WIRE_BYTES = 2


def _encode_varint_slow(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _two_byte_table(high_bit: int) -> list[bytes]:
    """The two bytes of every 14-bit value v: its low 7 bits with the continuation bit, then
    the rest (with `high_bit` set). Built at every start, so in C: the pairs' bytes laid out by
    slice assignment and cut into 16,384 objects by one unpack, not a Python call and an int
    object per value."""
    pairs = bytearray(2 * _VARINT_CACHE_LIMIT)
    pairs[0::2] = bytes(range(0x80, 0x100)) * 0x80  # low 7 bits, continuation bit set
    pairs[1::2] = b"".join(bytes((high | high_bit,)) * 0x80 for high in range(0x80))
    return list(_PAIRS.unpack(pairs))


# Below 2**14 a varint is one byte, or two: the low 7 bits with the continuation bit, then the rest.
_SMALL_VARINTS = list(map(bytes, zip(range(0x80)))) + _two_byte_table(0)[0x80:]
# The low 14 bits of a larger value: two bytes, both with the continuation bit set.
_LOW14 = _two_byte_table(0x80)
_HIGH_PARTS: dict[int, bytes] = {}


def varint(value: int) -> bytes:
    """Varint of a non-negative int; negative ints are written as their 64-bit two's complement.

    Large args values (ids, addresses) mostly share their bits above 28 with others, so that
    part is cached and the rest comes from a table, instead of a nine-step Python loop.
    """
    if 0 <= value < _VARINT_CACHE_LIMIT:
        return _SMALL_VARINTS[value]
    if 0 < value < 1 << 28:
        return _LOW14[value & 0x3FFF] + _SMALL_VARINTS[value >> 14]
    if 0 < value < 1 << 63:
        high = _HIGH_PARTS.get(value >> 28)
        if high is None:
            if len(_HIGH_PARTS) > 4096:
                _HIGH_PARTS.clear()
            high = _HIGH_PARTS[value >> 28] = _encode_varint_slow(value >> 28)
        return _LOW14[value & 0x3FFF] + _LOW14[(value >> 14) & 0x3FFF] + high
    return _encode_varint_slow(value & 0xFFFFFFFFFFFFFFFF)


def tag(field: int, wire_type: int) -> bytes:
    return varint((field << 3) | wire_type)


# The two helpers below run per descriptor and per interned string (20k of each on a rank of
# 20k replay streams): their tags are varints made directly, without a call to tag().
def varint_field(field: int, value: int) -> bytes:
    return varint(field << 3 | WIRE_VARINT) + varint(value)


def bytes_field(field: int, payload: bytes) -> bytes:
    return varint(field << 3 | WIRE_BYTES) + length_prefixed(payload)


def length_prefixed(payload: bytes) -> bytes:
    size = len(payload)
    return (_SMALL_VARINTS[size] if size < _VARINT_CACHE_LIMIT else varint(size)) + payload


def string_field(field: int, text: str) -> bytes:
    return bytes_field(field, text.encode("utf-8", "surrogatepass"))
