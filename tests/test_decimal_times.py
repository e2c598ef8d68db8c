"""Exact nanoseconds from times as written, in bulk, against Decimal arithmetic."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from converter.inputs.decimal_times import FLOAT_EXACT_LIMIT_US, exact_ns, numbers_ns

# JSON numbers as profilers (and other tools) write microseconds: ints, up to 3 decimals,
# more decimals, exponents, negatives, 19-digit epoch stamps.
_number = st.one_of(
    st.integers(min_value=-10**16, max_value=10**17).map(str),
    st.tuples(st.integers(min_value=-10**16, max_value=10**16), st.integers(min_value=0, max_value=999_999),
              st.integers(min_value=1, max_value=6)).map(lambda t: f"{t[0]}.{str(t[1]).zfill(6)[:t[2]]}"),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-1e18, max_value=1e18).map(repr),
    st.decimals(allow_nan=False, allow_infinity=False, places=4, min_value=-10**12, max_value=10**12).map(
        lambda d: f"{d:E}"),
    # Where the ns leave int64, and 3 decimals with 18 or 19 digits.
    st.sampled_from(["9223372036854775", "9223372036854776", "922337203685477.580", "999999999999999.999",
                     "9223372036854775.807", "0.000", "0", "12.5", "1.", ".5"]),
)


def _oracle(text: str) -> tuple[int, bool]:
    """(ns, known): Decimal arithmetic, known where the ns fit int64."""
    ns = int((Decimal(text) * 1000).to_integral_value())
    return (ns, True) if -(1 << 63) <= ns < 1 << 63 else (0, False)


def _as_pairs(values, known) -> list[tuple[int, bool]]:
    return list(zip(values.tolist(), known.tolist()))


@settings(max_examples=300, deadline=None)
@given(st.lists(_number, max_size=40))
def test_bulk_times_equal_decimal_arithmetic(texts):
    assert _as_pairs(*exact_ns([text.encode() for text in texts])) == [_oracle(text) for text in texts]


def test_what_is_not_a_number_has_no_time():
    assert _as_pairs(*exact_ns([b"null", b'"5"', b"true", b"[1]", b"5"])) == \
        [(0, False), (0, False), (0, False), (0, False), (5000, True)]
    assert _as_pairs(*exact_ns([])) == []
    # Commas inside a text: the texts are joined with commas, so their lengths are then
    # taken one by one.
    assert _as_pairs(*exact_ns([b'"1,5"', b"2.5", b"[1,2]", b"7"])) == [(0, False), (2500, True), (0, False), (7000, True)]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.lists(st.one_of(st.integers(min_value=-2**70, max_value=2**70), st.floats(allow_nan=False)),
                          max_size=40),
                 st.lists(st.integers(min_value=-2**70, max_value=2**70), max_size=40)))
def test_numbers_as_decoded_equal_python_arithmetic(numbers):
    """Known where exact in int64: a run of ints at any size, a float (or an int among floats)
    below 2**40 us, rounded as round() does."""
    all_ints = all(type(number) is int for number in numbers)
    expected = [(number * 1000, True) if all_ints and -(1 << 63) <= number * 1000 < 1 << 63 else
                (round(number * 1000), True) if -FLOAT_EXACT_LIMIT_US < number < FLOAT_EXACT_LIMIT_US else (0, False)
                for number in numbers]
    assert _as_pairs(*numbers_ns(numbers)) == expected
