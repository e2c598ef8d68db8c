"""Exact nanoseconds from times as written, in bulk, against Decimal arithmetic."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from converter.inputs.decimal_times import exact_ns

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


def _oracle(text: str) -> int:
    return int((Decimal(text) * 1000).to_integral_value())


@settings(max_examples=300, deadline=None)
@given(st.lists(_number, max_size=40))
def test_bulk_times_equal_decimal_arithmetic(texts):
    assert exact_ns([text.encode() for text in texts]) == [_oracle(text) for text in texts]


def test_what_is_not_a_number_has_no_time():
    assert exact_ns([b"null", b'"5"', b"true", b"[1]", b"5"]) == [None, None, None, None, 5000]
    assert exact_ns([]) == []
