"""Interned strings of a Perfetto packet sequence: each name is written once, then referenced
by its iid."""

from __future__ import annotations

from typing import NamedTuple

from .fields import DebugAnnotation, DebugAnnotationName, EventCategory, EventName, InternedData, TrackEvent
from .wire import bytes_field, string_field, varint_field


class InternedKind(NamedTuple):
    """Where one kind of interned string is written: its InternedData field, that entry's iid and
    name fields, and the field that references it by iid."""

    interned: int
    iid: int
    name: int
    reference: int


EVENT_NAMES = InternedKind(InternedData.EVENT_NAMES, EventName.IID, EventName.NAME, TrackEvent.NAME_IID)
EVENT_CATEGORIES = InternedKind(InternedData.EVENT_CATEGORIES, EventCategory.IID, EventCategory.NAME,
                                TrackEvent.CATEGORY_IIDS)
ANNOTATION_NAMES = InternedKind(InternedData.DEBUG_ANNOTATION_NAMES, DebugAnnotationName.IID, DebugAnnotationName.NAME,
                                DebugAnnotation.NAME_IID)


class Interner:
    """Iids for one kind of interned string. `field(text)` gives the ready-encoded reference;
    a new string's InternedData entry waits in the shared `pending` list for the next packet."""

    def __init__(self, kind: InternedKind, pending: list[bytes]):
        self.kind = kind
        self.pending = pending
        self.references: dict[str, bytes] = {}
        self._skipped = 0

    def skip(self) -> None:
        """Pass over the next iid: one a prepared encoding kept for a name it never referenced."""
        self._skipped += 1

    def field(self, text: str) -> bytes:
        reference = self.references.get(text)
        if reference is None:
            kind, iid = self.kind, len(self.references) + self._skipped + 1
            reference = self.references[text] = varint_field(kind.reference, iid)
            self.pending.append(bytes_field(kind.interned, varint_field(kind.iid, iid) + string_field(kind.name, text)))
        return reference


def annotation_name_interner(pending: list[bytes]) -> Interner:
    """Iids for debug annotation names (the keys of every slice's args)."""
    return Interner(ANNOTATION_NAMES, pending)
