#!/usr/bin/env python3
"""A benchmark corpus shaped like reality: each real trace tiled in time to a target size.

    python benchmarks/corpus.py --sizes 100MB,1GB,2GB            # every trace of ../shared/traces
    python benchmarks/corpus.py --sizes 100MB --only hta_nccl_a100
    python benchmarks/corpus.py --rank-sets 1GB                 # the 8 DLRM ranks, 1 GB in all

Real Kineto events average 250-400 bytes with many args and arrive on many threads and
streams; the generator's are cheaper per byte, so speed is claimed only from these. A tiled
trace is the source's header, then its events over and over, each copy shifted in time past
the previous one (by the source's span plus 1 ms) and with every id that links events
(flow ids, correlation, External id, Python ids) moved to a range of its own, so flows,
launches and Python stacks bind within each copy as in the source. Process and thread
metadata appear once. The generator's CUDA-graph pipeline rank is tiled alike, as a second
kind, and as a third on 1k or 20k replay streams in the orders real exporters write
(STREAM_SHAPES, replay_streams.py). Written under benchmarks/out/corpus/ (never committed), streamed copy by copy.

A rank set (the real 8-rank DLRM run, for merges) is tiled rank by rank to its share of the
size, every rank shifted by the same span per copy (the longest rank's), so the ranks stay
aligned on their baseTimeNanoseconds as in the source.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from pathlib import Path
from typing import Any, Iterator

import orjson

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.replay_streams import ReplayStreams, StreamShape, kept_metadata  # noqa: E402  (after the path set-up)
from benchmarks.run import parse_size  # noqa: E402

SHARED_TRACES = REPO.parent / "shared" / "traces"
DEFAULT_OUT = REPO / "benchmarks" / "out" / "corpus"
# args that link events: shifted per copy so each copy's links stay its own.
LINK_ARGS = ("correlation", "External id", "Python id", "Python parent id", "Sequence number", "Ev Idx")
GAP_US = 1000.0
# The generator's rank on thousands of replay streams (replay_streams.py), time-sorted, its
# streams' metadata where real exporters put it.
STREAM_SHAPES = {"cuda_graph_1k_streams_meta_first": StreamShape(1000, "first"),
                 "cuda_graph_20k_streams_meta_first": StreamShape(20000, "first"),
                 "cuda_graph_20k_streams_meta_last": StreamShape(20000, "last"),
                 "cuda_graph_20k_streams_interleaved": StreamShape(20000, "interleaved")}


def sources(only: list[str]) -> dict[str, Path]:
    """name -> trace file: the single-rank real traces, rank 0 of DLRM, and a generated
    CUDA-graph pipeline rank (written once under the corpus directory)."""
    found = {p.name.split(".json")[0]: p for p in sorted(SHARED_TRACES.glob("*.json.gz"))}
    if (SHARED_TRACES / "dlrm_8ranks").is_dir():
        found["dlrm_rank0"] = SHARED_TRACES / "dlrm_8ranks" / "rank0_trace.json.gz"
    found["generated_cuda_graph_pp_rank"] = Path("generated")
    found.update(dict.fromkeys(STREAM_SHAPES, Path("generated")))
    return {name: path for name, path in found.items() if not only or name in only}


def load(name: str, path: Path, out: Path) -> dict:
    if path == Path("generated"):
        from converter.generator import write_pp_run

        path = out / "source_generated" / "rank0_trace.json"
        if not path.exists():
            write_pp_run(path.parent, pp_size=4, steps=2, seed=1, streams_per_graph=24, graphs_per_step=24,
                         kernels_per_replay=64)
    raw = path.read_bytes()
    return orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def _timed(document: dict) -> list[dict]:
    return [e for e in document.get("traceEvents", [])
            if isinstance(e, dict) and e.get("ph") != "M" and isinstance(e.get("ts"), (int, float))]


def _span(timed: list[dict]) -> int:
    """How far each copy is shifted past the previous one: the source's span plus a gap, in
    whole microseconds, so shifted times keep the digits the profiler wrote (see _shifted)."""
    return math.ceil(max(e["ts"] + (e.get("dur") or 0) for e in timed) - min(e["ts"] for e in timed) + GAP_US)


def tiled(document: dict, target_bytes: int, span: int = 0, shape: StreamShape | None = None) -> Iterator[bytes]:
    """The tiled trace's JSON text, piece by piece, until it reaches `target_bytes`; each copy
    is shifted by `span` us (default: the source's own span plus a gap). With a `shape`, on
    that many replay streams in its order (replay_streams.py)."""
    events = [e for e in document.get("traceEvents", []) if isinstance(e, dict)]
    metadata = [e for e in events if e.get("ph") == "M"]
    timed = _timed(document)
    start = min(e["ts"] for e in timed)
    span = span or _span(timed)
    id_range = 1 + max(_links(timed))
    replays = ReplayStreams(timed, shape) if shape else None
    if replays:
        timed, metadata = replays.events, kept_metadata(metadata)
        metadata += list(replays.all_metadata()) if replays.shape.metadata == "first" else []
    header = {k: v for k, v in document.items() if k != "traceEvents"}
    yield orjson.dumps(header)[:-1] + b',"traceEvents":['
    written = 0
    for event in metadata:
        piece = orjson.dumps(event) + b","
        written += len(piece)
        yield piece
    copy = 0
    while written < target_bytes:
        shift, offset = copy * span, copy * id_range
        copied = [_shifted(e, shift, offset) for e in timed]
        piece = b",".join(map(orjson.dumps, replays.restreamed(copied, copy) if replays else copied)) + b","
        written += len(piece)
        yield piece
        copy += 1
    if replays and replays.shape.metadata == "last":
        yield b"".join(orjson.dumps(event) + b"," for event in replays.all_metadata())
    yield orjson.dumps({"ph": "i", "s": "g", "name": "Corpus End", "pid": "", "tid": "",
                        "ts": _shifted({"ts": start}, copy * span, 0)["ts"]}) + b"]}"


def _links(events: list[dict]) -> Iterator[int]:
    yield 0
    for event in events:
        if isinstance(event.get("id"), int):
            yield event["id"]
        args = event.get("args")
        if isinstance(args, dict):
            for key in LINK_ARGS:
                value = args.get(key)
                if isinstance(value, int) and not isinstance(value, bool):
                    yield value


def _shifted(event: dict, shift: int, offset: int) -> dict:
    if not shift:
        return event
    copy: dict[str, Any] = dict(event)
    # Integer microseconds stay integers; others keep at most the 3 decimals profilers write
    # (the float sum alone would print as 6579008.217000001, a time no profiler writes).
    copy["ts"] = event["ts"] + shift if isinstance(event["ts"], int) else round(event["ts"] + shift, 3)
    if isinstance(event.get("id"), int):
        copy["id"] = event["id"] + offset
    args = event.get("args")
    if isinstance(args, dict) and any(key in args for key in LINK_ARGS):
        copy["args"] = {key: value + offset if key in LINK_ARGS and isinstance(value, int)
                        and not isinstance(value, bool) and value > 0 else value
                        for key, value in args.items()}
    return copy


def build(sizes: list[str], only: list[str], out: Path) -> list[dict]:
    """Writes missing corpus files; returns one entry per file (name, size, path, bytes, events/bytes)."""
    out.mkdir(parents=True, exist_ok=True)
    built = []
    for name, path in sources(only).items():
        document = None
        for size in sizes:
            target = out / f"{name}_{size}.json"
            if not target.exists():
                document = document or load(name, path, out)
                temporary = target.with_suffix(".partial")
                with open(temporary, "wb") as stream:
                    for piece in tiled(document, _bytes(size), shape=STREAM_SHAPES.get(name)):
                        stream.write(piece)
                temporary.rename(target)
            built.append({"name": name, "size": size, "path": str(target), "bytes": target.stat().st_size})
            print(f"{target}: {target.stat().st_size / 1e6:.0f} MB", file=sys.stderr)
    return built


def build_rank_sets(sizes: list[str], out: Path) -> list[dict]:
    """The 8 DLRM ranks tiled to each size in all, under `<out>/dlrm_8ranks_<size>/`."""
    source = SHARED_TRACES / "dlrm_8ranks"
    built: list[dict] = []
    if not source.is_dir():
        return built
    documents = {path.name.split(".json")[0]: path for path in sorted(source.glob("rank*_trace.json.gz"))}
    for size in sizes:
        folder = out / f"dlrm_8ranks_{size}"
        if not folder.is_dir():
            loaded = {name: orjson.loads(gzip.decompress(path.read_bytes())) for name, path in documents.items()}
            span = max(_span(_timed(document)) for document in loaded.values())
            temporary = folder.with_name(folder.name + ".partial")
            temporary.mkdir(parents=True, exist_ok=True)
            for name, document in loaded.items():
                with open(temporary / f"{name}.json", "wb") as stream:
                    for piece in tiled(document, _bytes(size) // len(loaded), span):
                        stream.write(piece)
            temporary.rename(folder)
        total = sum(path.stat().st_size for path in folder.iterdir())
        built.append({"name": "dlrm_8ranks", "size": size, "path": str(folder), "bytes": total})
        print(f"{folder}: 8 ranks, {total / 1e6:.0f} MB", file=sys.stderr)
    return built


def _bytes(size: str) -> int:
    nbytes = parse_size(size).nbytes
    if nbytes is None:
        raise SystemExit(f"corpus: --sizes {size!r}: give bytes (100MB, 1GB), not events")
    return nbytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100MB", help="comma-separated sizes (MB = 10^6 bytes)")
    parser.add_argument("--only", default="", help="comma-separated source names (default: all)")
    parser.add_argument("--rank-sets", default="", help="comma-separated total sizes of the tiled 8 DLRM ranks "
                        "(for merges); alone, no single traces are tiled")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if not SHARED_TRACES.is_dir():
        print("corpus: ../shared/traces is absent; nothing to tile", file=sys.stderr)
        return 0
    rank_sets = [size for size in args.rank_sets.split(",") if size]
    entries = build_rank_sets(rank_sets, args.out)
    if not rank_sets or "--sizes" in (argv if argv is not None else sys.argv):
        entries += build(args.sizes.split(","), [n for n in args.only.split(",") if n], args.out)
    json.dump(entries, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
