"""Streaming output: Kineto Chrome-JSON text with exact ``us.nnn`` timestamps.

Times stay integer nanoseconds until written; each ``ts``/``dur`` is written as
``<us>.<3-digit ns>`` text (Kineto's own format), so absolute timestamps keep all
19 significant digits.  Dict events are serialized by orjson with the formatted
numbers spliced in as :class:`orjson.Fragment`; graph-replay kernels and flows
arrive from events.py already as JSON text.
"""

from __future__ import annotations

import gzip as _gzip
import io
import os
import random
from pathlib import Path
from typing import BinaryIO, Iterator, Optional, Sequence, Union

import orjson

from .config import DEFAULT_BASE_TIME_NS, GeneratorConfig
from .events import TraceGenerator

_Frag = orjson.Fragment
_dumps = orjson.dumps
_GZIP_LEVEL = 3
_FLUSH_BYTES = 1 << 20


def _trace_parts(cfg: GeneratorConfig) -> Iterator[bytes]:
    """The trace file as a stream of byte strings."""
    gen = TraceGenerator(cfg)
    header = gen.header()
    base = gen.tbase
    head = _dumps(header)
    # Re-open the header object and start the traceEvents array.
    yield head[:-1] + b',"traceEvents":[\n'
    first = True
    for chunk in gen.chunks():
        if not chunk:
            continue
        parts = []
        for ev in chunk:
            if ev.__class__ is bytes:  # already final JSON text
                parts.append(ev)
                continue
            t = ev["ts"] - base
            ev["ts"] = _Frag("%d.%03d" % (t // 1000, t % 1000))
            d = ev.get("dur")
            if d is not None:
                ev["dur"] = _Frag("%d.%03d" % (d // 1000, d % 1000))
            parts.append(_dumps(ev))
        body = b",\n".join(parts)
        if first:
            first = False
            yield body
        else:
            yield b",\n" + body
    yield b'\n],"traceName":' + _dumps(gen.trace_name) + b"}\n"


def _write_parts(cfg: GeneratorConfig, f: Union[BinaryIO, _gzip.GzipFile]) -> None:
    buf: list[bytes] = []
    size = 0
    for part in _trace_parts(cfg):
        buf.append(part)
        size += len(part)
        if size >= _FLUSH_BYTES:
            f.write(b"".join(buf))
            buf, size = [], 0
    if buf:
        f.write(b"".join(buf))


def trace_bytes(cfg: GeneratorConfig) -> bytes:
    """The whole trace file content (for small traces and tests)."""
    f = io.BytesIO()
    _write_parts(cfg, f)
    return f.getvalue()


def build_trace(cfg: GeneratorConfig) -> dict:
    """The parsed trace (what ``json.load`` of :func:`write_trace`'s file gives)."""
    return orjson.loads(trace_bytes(cfg))


def write_trace(cfg: GeneratorConfig, path: Union[str, os.PathLike], gzip: Optional[bool] = None) -> Path:
    """Write the trace to `path` in constant memory; gzip-compressed when `gzip`
    is True or (by default) when the name ends with ``.gz``.  Same config ->
    identical bytes (the gzip header carries no name or time)."""
    path = Path(path)
    if gzip is None:
        gzip = path.name.endswith(".gz")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as raw:
        if gzip:
            with _gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=_GZIP_LEVEL, mtime=0) as gz:
                _write_parts(cfg, gz)
        else:
            _write_parts(cfg, raw)
    return path


def write_pp_run(
    out_dir: Union[str, os.PathLike],
    pp_size: int,
    dp_size: int = 1,
    schedule: str = "1f1b",
    microbatches: int = 4,
    steps: int = 2,
    seed: int = 0,
    shuffle_global_ranks: bool = True,
    truncate_last_recv: bool = False,
    events_per_rank: Optional[int] = None,
    *,
    stages_per_rank: Optional[int] = None,
    pg_config_style: str = "list",
    time_format: str = "relative",
    base_time_ns: int = DEFAULT_BASE_TIME_NS,
    gzip: bool = False,
    clock_offsets_ns: Optional[Sequence[int]] = None,
    clock_drift_ppm: Optional[Sequence[float]] = None,
    **config,
) -> list[Path]:
    """A pipeline-parallel job: one ``rank{G}_trace.json`` per global rank.

    ``pp_size * dp_size`` ranks in ``dp_size`` pipelines.  Global ranks are
    assigned to pipeline positions by a seeded shuffle (so a pg_config "mesh_pp"
    ``ranks`` list is not in ascending order) unless `shuffle_global_ranks` is
    False.  Every file has its own baseTimeNanoseconds; all agree on one absolute
    clock.  `truncate_last_recv`: the capture window of the first pipeline's PP
    rank 0 ends where its last receive of the last step would start, so that
    receive is missing.  `events_per_rank`: choose the step count so each file
    has about that many events (overrides `steps`).  `clock_offsets_ns` and
    `clock_drift_ppm` (per global rank) give each rank's host a clock that is off
    by that much at `base_time_ns` and runs that many parts per million fast, so
    tests know the truth a clock estimate should find.  Extra keyword arguments go
    to :class:`GeneratorConfig` (e.g. ``kernels_per_replay=16``).
    Returns the paths, ordered by global rank.
    """
    if pp_size < 1 or dp_size < 1:
        raise ValueError("pp_size and dp_size must be >= 1")
    world = pp_size * dp_size
    order = list(range(world))
    if shuffle_global_ranks and pp_size > 1:
        rng = random.Random(f"cgtrace-ranks:{seed}:{pp_size}:{dp_size}")
        while True:
            rng.shuffle(order)
            if any(order[p * pp_size:(p + 1) * pp_size] != sorted(order[p * pp_size:(p + 1) * pp_size])
                   for p in range(dp_size)):
                break
    groups = [order[p * pp_size:(p + 1) * pp_size] for p in range(dp_size)]

    def cfg_for(rank: int, n_steps: int, truncate: bool) -> GeneratorConfig:
        pipe = next(g for g in groups if rank in g)
        return GeneratorConfig(
            seed=seed, steps=n_steps, rank=rank, world_size=world, pp_groups=groups,
            pp_size=pp_size, pp_rank=pipe.index(rank), schedule=schedule, microbatches=microbatches,
            stages_per_rank=stages_per_rank, truncate_last_recv=truncate, annotation_gaps=True,
            pg_config_style=pg_config_style, time_format=time_format, base_time_ns=base_time_ns,
            trace_name=f"rank{rank}_trace.json" + (".gz" if gzip else ""), **config,
        )

    if events_per_rank is not None:
        # Size one step on every rank, then pick a common step count.
        sizes = [sum(len(c) for c in TraceGenerator(cfg_for(rank, 1, False)).chunks()) for rank in range(world)]
        steps = max(1, round(events_per_rank * world / sum(sizes)))

    truncated = groups[0][0] if truncate_last_recv else None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in range(world):
        name = f"rank{rank}_trace.json" + (".gz" if gzip else "")
        paths.append(write_trace(cfg_for(rank, steps, rank == truncated), out / name, gzip=gzip))
        offset = clock_offsets_ns[rank] if clock_offsets_ns else 0
        drift = clock_drift_ppm[rank] if clock_drift_ppm else 0.0
        if offset or drift:
            if time_format != "relative":
                raise ValueError("clock offsets and drift need time_format 'relative'")
            _skew_clock(paths[-1], offset, drift, base_time_ns)
    return paths


def _skew_clock(path: Path, offset: int, drift_ppm: float, origin: int) -> None:
    """Rewrite a written trace as a host whose clock reads `offset` ns off at `origin` and
    gains `drift_ppm` per million: the offset moves baseTimeNanoseconds, the drift every ts."""
    packed = path.name.endswith(".gz")
    document = orjson.loads(_gzip.decompress(path.read_bytes()) if packed else path.read_bytes())
    base = document["baseTimeNanoseconds"]
    for event in document["traceEvents"]:
        if "ts" in event:
            ts = round(event["ts"] * 1000)
            ts += round((base + ts - origin) * drift_ppm / 1e6)
            sign, ts = ("-", -ts) if ts < 0 else ("", ts)
            event["ts"] = _Frag("%s%d.%03d" % (sign, ts // 1000, ts % 1000))
    document["baseTimeNanoseconds"] = base + offset
    text = _dumps(document)
    path.write_bytes(_gzip.compress(text, _GZIP_LEVEL, mtime=0) if packed else text)
