"""Finding a trace's traceEvents array and cutting it into pieces that decode one at a time.

Decoding the whole array at once keeps a Raw object per event alive (a large transient on a
big trace, and the fragmented heap they leave behind stays with the process) and touches
every page of the input at once. Piece by piece, only one piece's events are alive and the
reader can release the input's pages as it goes.

A cut goes between two events, at `}` `,` `{`. The same bytes can occur inside a string or a
nested value; then the piece does not decode on its own (a cut inside a string leaves it
unterminated, one inside a nested value leaves a bracket open). The piece then ends where its
last event does, found by walking its strings and brackets once from its first event: growing
it a candidate at a time re-copies and re-decodes it per candidate, quadratic where a string
holds thousands of them or the text is not JSON at all. So a piece that decodes holds exactly
whole events, and any document this cannot cut cleanly (one that is not valid JSON included)
is read whole by the caller instead, which names the error.
"""

from __future__ import annotations

import re
from typing import Callable, Iterator, Optional, Sequence

import msgspec

from ..tuning import DEFAULT_TUNING

_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BOUNDARY = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
# One bracket outside strings, and all before it (strings whole, escapes included): what the
# walk to an event's end sees, a few steps per event however many strings it holds.
_NEXT_BRACKET = re.compile(rb'[^"\[\]{}]*+(?:"[^"\\]*+(?:\\.[^"\\]*+)*+"[^"\[\]{}]*+)*+([\[\]{}])', re.DOTALL)
NON_SPACE = re.compile(rb"[^ \t\r\n]")
HEADER_DECODER = msgspec.json.Decoder(dict[str, msgspec.Raw])   # a document's top-level keys, values raw
RAW_LIST_DECODER = msgspec.json.Decoder(list[msgspec.Raw])      # an array's elements, raw
_DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError)
_END_CANDIDATES = 16     # ']' positions tried, from the end, as the array's close
_LAST_PIECE_TRIES = 4    # cut candidates tried before that close
_LAST_PIECE_WINDOW = 1 << 20


class PiecesFailed(Exception):
    """The document cannot be cut cleanly (or is not valid JSON): read it whole."""


class EventsLayout(msgspec.Struct):
    """Where a document's traceEvents array lies, and the rest of the document decoded."""

    header: dict[str, msgspec.Raw]  # every top-level key but traceEvents
    start: int                      # first byte inside the array
    end: int                        # the array's closing ']'


def locate_events(text) -> Optional[EventsLayout]:
    """Where the events are, checked: the header decodes and the last piece decodes.
    None when the document does not have the expected shape."""
    first = NON_SPACE.search(text)
    if first is None:
        return None
    header_of: Callable[[int], Optional[dict]]
    if text[first.start():first.start() + 1] == b"[":
        open_at, header_of = first.start(), lambda end: {}
    else:
        match = _KEY.search(text)
        if match is None:
            return None
        open_at = match.end() - 1
        header_of = lambda end: _header(text, open_at, end)  # noqa: E731
    end = len(text)
    for _ in range(_END_CANDIDATES):
        end = text.rfind(b"]", open_at + 1, end)
        if end < 0:
            return None
        header = header_of(end)
        if header is not None and _last_piece_decodes(text, open_at + 1, end):
            return EventsLayout(header, open_at + 1, end)
    return None


def _header(text, open_at: int, end: int) -> Optional[dict]:
    try:
        header = HEADER_DECODER.decode(text[:open_at + 1] + text[end:])
    except _DECODE_ERRORS:
        return None
    events = header.pop("traceEvents", None)
    return header if events is not None and bytes(events) == b"[]" else None


def _last_piece_decodes(text, start: int, end: int) -> bool:
    window_start = max(start, end - _LAST_PIECE_WINDOW)
    cuts = [m.end() - 1 for m in _BOUNDARY.finditer(text, window_start, end)][-_LAST_PIECE_TRIES:]
    if window_start == start:
        cuts.insert(0, start)
    for cut in reversed(cuts):
        try:
            RAW_LIST_DECODER.decode(_bracketed(text, cut, end))
            return True
        except _DECODE_ERRORS:
            continue
    return False


def iter_pieces(text, layout: EventsLayout, decoders: Callable[[], Sequence[msgspec.json.Decoder]] = tuple,
                piece_bytes: int = DEFAULT_TUNING.piece_bytes) -> Iterator[tuple[list, int, int]]:
    """(the piece's events, its start and end offsets in `text`), in file order, each about
    `piece_bytes` long (1 MiB: a piece's decoded events strand less of the heap than 4 MiB
    did, as the slices made meanwhile pin the pages they were freed from, and they stay in the
    CPU's caches). A piece is decoded by the first of `decoders()` that takes it whole, else
    as raw events (one Raw each), which any JSON array gives: only a piece cut inside an event
    fails that. `decoders` is asked afresh for every piece, so a caller may change its choice
    between pieces."""
    start, end = layout.start, layout.end
    while start < end:
        search_from = start + piece_bytes
        chosen = decoders()
        match = _BOUNDARY.search(text, search_from, end) if search_from < end else None
        cut, next_start = (match.start() + 1, match.end() - 1) if match else (end, end)
        events = _decoded(_bracketed(text, start, cut), chosen)
        if events is None and match is not None:
            cut, next_start = _end_of_event_past(text, start, search_from, end)
            events = _decoded(_bracketed(text, start, cut), chosen)
        if events is None:
            raise PiecesFailed()
        yield events, start, cut
        start = next_start


def spans(text, layout: EventsLayout, span_bytes: int) -> list[EventsLayout]:
    """The events cut at the first `}` `,` `{` past every `span_bytes`: layouts for
    iter_pieces each. A cut inside a string or a nested value leaves the span before it
    unbalanced, so that span does not decode: whoever reads the spans then reads the rest
    from that span's start in one, as iter_pieces would have."""
    cuts, start = [], layout.start
    while start < layout.end:
        match = _BOUNDARY.search(text, start + span_bytes, layout.end) if start + span_bytes < layout.end else None
        cut, next_start = (match.start() + 1, match.end() - 1) if match else (layout.end, layout.end)
        cuts.append(EventsLayout(layout.header, start, cut))
        start = next_start
    return cuts


def _end_of_event_past(text, start: int, search_from: int, end: int) -> tuple[int, int]:
    """(the cut after the first event of those from `start` that ends at or past
    `search_from`, where the next event starts): strings and brackets walked once. Text that
    is not JSON gives some cut, which then does not decode."""
    depth = 0
    for token in _NEXT_BRACKET.finditer(text, start, end):
        bracket = token[1]
        if bracket in (b"{", b"["):
            depth += 1
        elif bracket in (b"}", b"]"):
            depth -= 1
            if depth <= 0 and token.end() > search_from:
                boundary = _BOUNDARY.match(text, token.start(1), end)
                return (boundary.start() + 1, boundary.end() - 1) if boundary else (end, end)
    return end, end


def piece_events(text, start: int, end: int, decoder: msgspec.json.Decoder = RAW_LIST_DECODER) -> list:
    """The events of the piece `text[start:end]` that iter_pieces gave, decoded again by
    `decoder` (default: raw)."""
    return decoder.decode(_bracketed(text, start, end))


def _decoded(piece: bytes, decoders: Sequence[msgspec.json.Decoder]) -> Optional[list]:
    for decoder in (*decoders, RAW_LIST_DECODER):
        try:
            return decoder.decode(piece)
        except _DECODE_ERRORS:
            continue
    return None


def _bracketed(text, start: int, end: int) -> bytes:
    """`[` + text[start:end] + `]` in one copy (the text may be a memory map)."""
    with memoryview(text) as view:
        return b"".join((b"[", view[start:end], b"]"))
