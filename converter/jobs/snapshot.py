"""A prepared rank kept on disk between a merge's two passes, so every rank is read once.

Pass one reads, compacts and finds a rank's PP blocks; pass two writes the rank's part once
the arrows across ranks are paired, from the same trace. Reading the JSON is most of a
rank's work, while the pickled model loads in a small fraction of that time. The snapshot is three files beside each other
in the merge's scratch folder: the model (pickled, one object graph, so the blocks' slices
keep pointing at the trace's tracks), the args' raw JSON text, and where pass one had them,
the args already encoded for the Perfetto writer (the args helper's work), so pass two
redoes neither.
"""

from __future__ import annotations

import mmap
import os
import pickle
from array import array
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import msgspec

from ..model import ArgsStore
from ..outputs.prepared_args import ARGS_FORM, EncodedArgs
from .runner import Prepared

_MODEL, _RAW, _ENCODED = ".model", ".args", ".encoded"


def save_snapshot(prepared: Prepared, path: Path) -> None:
    """Write `prepared` to `path` (and its two sibling files); its args store is read, not changed."""
    store = prepared.trace.args
    raw_bounds = _write_raw(store, path.with_suffix(_RAW))
    encoded = store.prepared(ARGS_FORM)
    encoded_meta = _write_encoded(encoded, path.with_suffix(_ENCODED)) if isinstance(encoded, EncodedArgs) else None
    detached = msgspec.structs.replace(prepared, trace=msgspec.structs.replace(prepared.trace, args=ArgsStore()))
    with open(path.with_suffix(_MODEL), "wb") as stream:
        pickle.dump((detached, raw_bounds, encoded_meta), stream, protocol=pickle.HIGHEST_PROTOCOL)


def load_snapshot(path: Path) -> Prepared:
    """The Prepared that `save_snapshot` wrote, its args served from the snapshot's files."""
    with open(path.with_suffix(_MODEL), "rb") as stream:
        prepared, raw_bounds, encoded_meta = pickle.load(stream)
    store = SnapshotArgs(_mapped(path.with_suffix(_RAW)), raw_bounds)
    if encoded_meta is not None:
        names, bounds = encoded_meta
        store.keep_prepared(ARGS_FORM, EncodedArgs(names, _mapped(path.with_suffix(_ENCODED)), bounds))
    prepared.trace.args = store
    return prepared


class SnapshotArgs(ArgsStore):
    """Raw args text from a snapshot's file (memory-mapped: read once, in order, by the writer)."""

    def __init__(self, blob: Any, bounds: array):
        super().__init__()
        self._blob = blob
        self._bounds = bounds  # entry i is blob[bounds[i]:bounds[i + 1]]

    def __len__(self) -> int:
        return len(self._bounds) - 1

    def add_many(self, texts: list[Any]) -> int:
        raise TypeError("a snapshot's args are read-only")

    def text(self, reference: int) -> bytes:
        return self._blob[self._bounds[reference]:self._bounds[reference + 1]]

    def sweep(self, references: Sequence[int]) -> Iterator[bytes]:
        return (self.text(reference) for reference in references)


def _write_raw(store: ArgsStore, path: Path) -> array:
    bounds = array("Q", [0])
    with open(path, "wb") as stream:
        end = 0
        for text in store.sweep(range(len(store))):
            stream.write(text)
            end += len(text)
            bounds.append(end)
    return bounds


def _write_encoded(encoded: EncodedArgs, path: Path) -> tuple[list[Optional[str]], array]:
    with open(path, "wb") as stream:
        encoded.write_blob(stream)
    return list(encoded.interned), encoded.bounds


def _mapped(path: Path) -> Any:
    """The file's bytes through the page cache (an empty file maps to nothing, so b"")."""
    with open(path, "rb") as stream:
        size = os.fstat(stream.fileno()).st_size
        return mmap.mmap(stream.fileno(), size, access=mmap.ACCESS_READ) if size else b""

