"""Interned strings of a Perfetto packet sequence: each name is written once, then referenced
by its iid."""

from __future__ import annotations

from .wire import bytes_field, string_field, varint_field

# InternedData fields, and the TrackEvent / DebugAnnotation fields that reference them.
INTERNED_CATEGORIES, INTERNED_NAMES, INTERNED_ANNOTATION_NAMES = 1, 2, 3
CATEGORY_IIDS, NAME_IID, ANNOTATION_NAME_IID = 3, 10, 1


class Interner:
    """Iids for one kind of interned string. `field(text)` gives the ready-encoded reference;
    a new string's InternedData entry waits in the shared `pending` list for the next packet."""

    def __init__(self, interned_field: int, reference_field: int, pending: list[bytes]):
        self.interned_field = interned_field
        self.reference_field = reference_field
        self.pending = pending
        self.references: dict[str, bytes] = {}

    def field(self, text: str) -> bytes:
        reference = self.references.get(text)
        if reference is None:
            iid = len(self.references) + 1
            reference = self.references[text] = varint_field(self.reference_field, iid)
            self.pending.append(bytes_field(self.interned_field, varint_field(1, iid) + string_field(2, text)))
        return reference


def annotation_name_interner(pending: list[bytes]) -> Interner:
    """Iids for debug annotation names (the keys of every slice's args)."""
    return Interner(INTERNED_ANNOTATION_NAMES, ANNOTATION_NAME_IID, pending)
