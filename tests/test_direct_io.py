"""DirectWriter (converter/direct_io.py): whole blocks past the page cache, every byte readable
after `flush`, the exact bytes after `close`, with or without O_DIRECT underneath."""

from __future__ import annotations

import os
import random

import pytest

from converter.fileio.direct import BLOCK, DirectWriter


@pytest.fixture(params=["as the file system allows", "buffered"])
def try_direct(request) -> bool:
    return request.param != "buffered"


def test_writes_of_any_size_read_back_exactly(tmp_path, try_direct):
    path = tmp_path / "out.bin"
    rng = random.Random(7)
    # Sizes around the block and the 4 MB buffer, so writes straddle both.
    sizes = [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 3, (1 << 22) - 5, 10, (1 << 22) + BLOCK + 3, 777]
    chunks = [rng.randbytes(size) for size in sizes]
    with open(path, "wb") as file:
        writer = DirectWriter(file.fileno(), try_direct)
        reader = os.open(path, os.O_RDONLY)
        try:
            written = b""
            for chunk in chunks:
                assert writer.write(chunk) == len(chunk)
                written += chunk
                writer.flush()
                # Readable through another descriptor, padding or not behind it.
                assert os.pread(reader, len(written), 0) == written
                assert writer.size == len(written)
        finally:
            os.close(reader)
        writer.write(bytearray(b"tail"))
        writer.close()
        writer.close()  # twice is harmless
    assert path.read_bytes() == written + b"tail"


def test_close_without_flush_keeps_a_short_file_exact(tmp_path, try_direct):
    path = tmp_path / "short.bin"
    with open(path, "wb") as file:
        writer = DirectWriter(file.fileno(), try_direct)
        writer.write(memoryview(b"abc"))
        writer.close()
    assert path.read_bytes() == b"abc"


def test_a_file_system_that_rejects_direct_writes_gets_buffered_ones(tmp_path, monkeypatch):
    path = tmp_path / "picky.bin"
    real_pwrite, rejected = os.pwrite, []

    def pwrite(fd, data, offset):
        if writer.direct:
            rejected.append(offset)
            raise OSError(22, "Invalid argument")
        return real_pwrite(fd, data, offset)

    with open(path, "wb") as file:
        writer = DirectWriter(file.fileno())
        writer.direct = True  # as if the switch had worked, whatever this file system does
        monkeypatch.setattr(os, "pwrite", pwrite)
        writer.write(b"x" * (BLOCK + 10))
        writer.close()
    assert rejected == [0] and not writer.direct
    assert path.read_bytes() == b"x" * (BLOCK + 10)


def test_a_view_held_past_its_write_does_not_stop_the_close(tmp_path, monkeypatch, try_direct):
    """A sampling profiler (Dask's, in its workers) can hold a frame of the writer, and with it a
    view of the buffer, after the write returned: closing must still work. Here every view
    handed to pwrite is kept, as such a frame would keep it."""
    import converter.fileio.direct as direct

    kept = []
    real_pwrite = os.pwrite

    def pwrite_and_keep(fd, data, offset):
        kept.append(data)
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(direct.os, "pwrite", pwrite_and_keep)
    path = tmp_path / "out.bin"
    payload = random.Random(3).randbytes((1 << 22) + 3 * BLOCK + 5)  # a full buffer, whole blocks and a tail
    with open(path, "wb") as file:
        writer = DirectWriter(file.fileno(), try_direct)
        writer.write(payload)
        writer.close()
    assert kept and path.read_bytes() == payload
