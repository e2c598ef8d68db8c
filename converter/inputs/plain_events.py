"""Runs of plain Kineto events (complete events, instants, flow steps with plain fields) ->
slices and flow events in bulk, a list operation per field, their nanoseconds exact from the
digits (real traces write times beyond what a float holds to the ns). An event the bulk path
cannot take goes to its phase's handler, in its place: both paths give the same model, in
the same order.
"""

from __future__ import annotations

import functools
from itertools import compress, repeat
from operator import is_
from typing import Any, Callable, Optional, Sequence

import msgspec
import numpy as np

from ..model import NO_ARGS, Trace, Track
from .kineto_events import EVENT
from .phase_handlers import PhaseHandlers, chrome_thread_key
from .piece_parts import PieceParts, PlainPart, picker, piece_parts

# The first halves of the look-up keys of those scopes' tracks: objects no input pid equals.
_GLOBAL_SCOPE, _PROCESS_SCOPE = object(), object()


class KinetoEvents(PhaseHandlers):
    """Kineto events -> trace model: runs of plain events in bulk, the others through the
    handlers."""

    def __init__(self, trace: Trace, base_ns: int):
        super().__init__(trace, base_ns)
        # (pid, tid) as written, or a scope's key (_tracks_of) -> track
        self._tracks_by_input_key: dict[tuple[Any, Any], Track] = {}

    def add_events(self, items: list, raw_piece: Optional[Callable[[], list[msgspec.Raw]]] = None) -> None:
        """Convert the events in order (piece_parts.py says how they are parted). `items` are
        decoded events or raw ones (decoded here); an event whose decoded times cannot give
        its exact nanoseconds is decoded again from `raw_piece()`: the same events, raw."""
        self.add_parts(piece_parts(items, self.base_ns), raw_piece)

    def add_parts(self, made: PieceParts, raw_piece: Optional[Callable[[], list[msgspec.Raw]]] = None) -> None:
        """Take a piece's parts in order, releasing each as it is done; `raw_piece` as for
        add_events (portable parts need none)."""
        self.trace.events_read += made.events_read
        if made.metadata:
            self.keep_metadata(made.metadata if type(made.metadata[0]) is not msgspec.Raw else
                               list(map(EVENT.decode, made.metadata)))
        if raw_piece is not None:
            raw_piece = functools.cache(functools.partial(made.raw_events, raw_piece))  # once per piece
        parts = made.parts
        for index, part in enumerate(parts):
            parts[index] = None
            if type(part) is PlainPart:
                self._add_plain_part(part)
            else:
                end = part.at + len(part.items)
                self._add_each(part.items, 0, len(part.items),
                               raw_piece and functools.partial(_raws_from, raw_piece, part.at, end))

    def _add_plain_part(self, part: PlainPart) -> None:
        """Slices of the complete events and instants, flow events of the rest, in order;
        tracks are made in the order of the run."""
        on: Sequence[Track] = self._tracks_of(part.keys, part.scoped)
        if len(part.flow_at):
            categories = part.flow_categories
            self.flow_events.extend(map(self.strings.setdefault, categories, categories), part.flow_ids,
                                    part.flow_phases, part.flow_starts,
                                    on if len(part.flow_at) == len(on) else picker(part.flow_at.tolist())(on),
                                    part.flow_enclosing)
            if not len(part.slice_at):
                return
            on = picker(part.slice_at.tolist())(on)
        has_args = part.has_args
        if has_args.all():
            references = np.arange(len(has_args)) + self.args.add_many(part.texts)
        else:
            references = np.full(len(has_args), NO_ARGS, np.int64)
            references[has_args] = np.arange(len(part.texts)) + self.args.add_many(part.texts)
        self.trace.slices.extend(part.starts, part.durations, part.names, part.categories, references, on,
                                 part.instants)

    def _tracks_of(self, keys: list, scoped: list) -> Sequence[Track]:
        """The track of each event keyed (pid, tid): its thread's, or for an instant scoped to
        its process or to the trace (`scoped`: (index, scope)), that scope's. One look-up per
        event in C, by its key as written; tracks first met here are made in the order their
        first events come, so a run's order numbers them as one by one would."""
        if scoped:
            keys = list(keys)
            for at, scope in scoped:
                keys[at] = (_GLOBAL_SCOPE, None) if scope == "g" else (_PROCESS_SCOPE, keys[at][0])
        tracks = self._tracks_by_input_key
        on: list[Any] = list(map(tracks.get, keys))  # None: a track not met before
        if None in on:
            for key in dict.fromkeys(compress(keys, map(is_, on, repeat(None)))):
                tracks[key] = self._track_for_input_key(key)
            on = list(map(tracks.__getitem__, keys))
        return on

    def _track_for_input_key(self, key: tuple[Any, Any]) -> Track:
        """The track of an event keyed (pid, tid) as the input wrote them (a decimal text tid is
        its int), or of a scope's instants."""
        if key[0] is _GLOBAL_SCOPE:
            return self.global_track()
        if key[0] is _PROCESS_SCOPE:
            return self.process_track(key[1])
        return self.thread_track(key[0], chrome_thread_key(key[1]))


def _raws_from(raws: Callable[[], list[msgspec.Raw]], start: int, end: int) -> list[msgspec.Raw]:
    """The raw events of an EachPart: its place in the piece."""
    return raws()[start:end]
