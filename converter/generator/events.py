"""Turn planned steps into Kineto trace events (streaming, integer-ns times).

Events are produced in chunks (one list per planned operation).  An item is
either a dict whose ``ts``/``dur`` are *absolute integer nanoseconds* (the writer
formats them as Kineto's microsecond text), or -- for the hot path, graph-replay
kernels and their flow arrows -- the event's final JSON text as ``bytes``.
Memory stays bounded by the largest operation (a few graph replays) plus
per-stream annotation state, independent of the trace length.
"""

from __future__ import annotations

import math
import random
from typing import Any, Iterator, Optional, Union

import orjson

from . import names as N
from .config import GeneratorConfig
from .plan import (
    ALLGATHER, COMM, COMPUTE, RECV_NEXT, RECV_PREV, REDUCESCATTER, SEND_NEXT, SEND_PREV, US,
    PlanParams, PlannedStep, graph_span_ns, next_start, plan_job_step,
)
from .schedules import pipeline_schedule

#: GPU stream of each eager lane; captured graphs get fresh streams from 20 up.
LANE_STREAMS = {
    COMPUTE: 7, COMM: 11, ALLGATHER: 13, REDUCESCATTER: 15,
    SEND_NEXT: 16, SEND_PREV: 17, RECV_PREV: 18, RECV_NEXT: 19,
}
GRAPH_STREAM_BASE = 20
#: With ``graph_lanes="all"`` (torch 2.15's export), graphed work moves to the lane its
#: annotation names: communication to named lanes, everything else to stream 7.
DEFAULT_GRAPH_LANE = 7
NAMED_GRAPH_LANES = {"nccl": (900, "mesh_dp"), "symm": (901, "symm_mem")}
_NEVER = 1 << 62

_KERNEL, _MEMCPY, _MEMSET = 0, 1, 2
_FLOW_END = b',"cat":"ac2g","name":"ac2g","bp":"e"}'


# ---------------------------------------------------------------------------
# CUDA-graph templates: one per captured graph, replayed every step.
# ---------------------------------------------------------------------------

class Template:
    """A captured graph: fixed nodes (names, streams, args) and a few timing variants."""

    __slots__ = ("nodes", "variants", "streams")

    def __init__(self, nodes, variants, streams):
        #: [(code, cat, name, stream, tail_args, nbytes, head, mid, tail_bytes, flow_mid)];
        #: head/mid/tail_bytes/flow_mid: the fixed JSON text around a kernel's and
        #: its flow's variable fields.
        self.nodes = nodes
        self.variants = variants    # [(starts, ends, span)] relative ns
        self.streams = streams      # streams the nodes use


def _kernel_tail(rng: random.Random, grid, block, regs, smem) -> dict:
    blocks = grid[0] * grid[1] * grid[2]
    threads = block[0] * block[1] * block[2]
    bpsm = round(blocks / N.NUM_SMS, 6)
    wpsm = round(bpsm * math.ceil(threads / 32), 6)
    occ = int(min(100.0, wpsm / 64 * 100) * rng.uniform(0.35, 0.95))
    return {
        "registers per thread": regs, "shared memory": smem, "blocks per SM": bpsm,
        "warps per SM": wpsm, "grid": list(grid), "block": list(block),
        "est. achieved occupancy %": occ,
    }


def _log_uniform(rng: random.Random, lo_ns: int, hi_ns: int) -> int:
    return int(lo_ns * math.exp(rng.random() * math.log(hi_ns / lo_ns)))


def build_template(cfg: GeneratorConfig, key: int, kind: str, layer_base: int) -> Template:
    """Graph `key` (stream block ``20 + key * streams_per_graph``) of kind F/B/I/W."""
    rng = random.Random(f"cgtrace-graph:{cfg.seed}:{cfg.rank}:{key}:{kind}")
    spg = cfg.streams_per_graph
    base = GRAPH_STREAM_BASE + key * spg
    streams = list(range(base, base + spg))
    compute = streams[:-1] if spg >= 2 else streams
    comm_stream = streams[-1] if spg >= 2 else None
    catalog = N.FORWARD_KERNELS if kind == "F" else N.BACKWARD_KERNELS
    weights = [k[-1] for k in catalog]
    comm_kinds = (["nccl"] if cfg.include_nccl else []) + (["symm"] if cfg.include_symm_mem else [])

    specs: list[tuple] = []    # (code, cat, name, stream, tail, nbytes, lo_ns, hi_ns)
    segments: list[tuple] = []

    def kernel_spec(entry, stream):
        name, lo, hi, grid, block, regs, smem = entry[:7]
        return (_KERNEL, "kernel", name, stream, _kernel_tail(rng, grid, block, regs, smem), 0,
                lo * US, hi * US)

    def compute_spec(stream):
        r = rng.random()
        if cfg.include_memcpy and r < 0.04:
            nbytes = 1 << rng.randint(12, 26)
            d = max(1500, nbytes // 1500)  # ~1.5 TB/s device-to-device
            return (_MEMCPY, "gpu_memcpy", N.MEMCPY_DTOD, stream, {}, nbytes, d, d * 2)
        if cfg.include_memset and r < 0.07:
            nbytes = 1 << rng.randint(10, 22)
            return (_MEMSET, "gpu_memset", N.MEMSET, stream, {}, nbytes, 1000, 3500)
        return kernel_spec(rng.choices(catalog, weights)[0], stream)

    cur = rng.randrange(len(compute))
    n = cfg.kernels_per_replay
    while len(specs) < n:
        remaining = n - len(specs)
        segment: Optional[tuple[str, list]] = None
        if remaining >= 2 and rng.random() < cfg.parallel_branch_fraction:
            use_comm = comm_stream is not None and bool(comm_kinds) and (
                len(compute) < 2 or rng.random() < 0.5)
            branches: list[list[int]] = []
            budget = remaining
            if use_comm:
                ck = rng.choice(comm_kinds)
                if ck == "symm" and budget >= 3:
                    idx = [len(specs), len(specs) + 1]
                    specs.append(kernel_spec(N.SYMM_BARRIER, comm_stream))
                    specs.append(kernel_spec(N.SYMM_ALLREDUCE, comm_stream))
                elif cfg.include_nccl:
                    idx = [len(specs)]
                    specs.append(kernel_spec(rng.choice(N.NCCL_GRAPH_KERNELS), comm_stream))
                else:
                    idx = []
                if idx:
                    branches.append(idx)
                    budget -= len(idx)
            avail = list(compute)
            rng.shuffle(avail)
            want = rng.choice((2, 2, 3)) - len(branches)
            for stream in avail[:max(0, want)]:
                if budget <= 0:
                    break
                m = min(budget, rng.randint(1, 3))
                branches.append(list(range(len(specs), len(specs) + m)))
                specs.extend(compute_spec(stream) for _ in range(m))
                budget -= m
            if len(branches) >= 2:
                segment = ("p", branches)
            elif branches:  # could not fork after all: keep the nodes as a sequential run
                segment = ("s", [i for b in branches for i in b])
        if segment is None:
            if rng.random() < 0.2:
                cur = rng.randrange(len(compute))
            stream = compute[cur % len(compute)]
            cur += 1
            m = min(remaining, rng.randint(2, 8))
            segment = ("s", list(range(len(specs), len(specs) + m)))
            specs.extend(compute_spec(stream) for _ in range(m))
        segments.append(segment)

    # Per-kernel CUDA-graph labels: runs of consecutive nodes share a label.
    if cfg.kernel_labels:
        layer, part, i = layer_base, 0, 0
        while i < len(specs):
            run = rng.randint(2, 8)
            if rng.random() < 0.75:
                label = f"layers.{layer}.{N.LAYER_PARTS[part]}"
                part += 1
                if part == len(N.LAYER_PARTS):
                    part, layer = 0, layer + 1
                for j in range(i, min(i + run, len(specs))):
                    s = specs[j]
                    specs[j] = s[:4] + ({**s[4], "name": label},) + s[5:]
            i += run

    span = graph_span_ns(kind, n)
    variants = []
    for _ in range(3):
        starts = [0] * len(specs)
        ends = [0] * len(specs)
        t = 0
        for seg_kind, body in segments:
            chains = [body] if seg_kind == "s" else body
            fork = join = t
            for chain in chains:
                bt = fork
                for i in chain:
                    s0 = bt + rng.randint(600, 2500)
                    bt = s0 + _log_uniform(rng, specs[i][6], specs[i][7])
                    starts[i], ends[i] = s0, bt
                join = max(join, bt)
            t = join
        target = int(span * rng.uniform(0.97, 1.03))
        starts = [x * target // t for x in starts]
        ends = [x * target // t for x in ends]
        variants.append((starts, ends, target))
    dev = cfg.gpu_device
    nodes = []
    for code, cat, name, stream, tail, nbytes, _, _ in specs:
        if cfg.graph_lanes == "all":
            stream, tail = _moved_to_lane(name, stream, tail)
        head = (b'{"ph":"X","cat":"%s","name":%s,"pid":%d,"tid":%d,"ts":'
                % (cat.encode(), orjson.dumps(name), dev, stream))
        mid = b',"queued":0,"device":%d,"context":1,"stream":%d,"correlation":' % (dev, stream)
        tail_bytes = (b"," + orjson.dumps(tail)[1:-1] if tail else b"") + b"}}"
        flow_mid = b',"pid":%d,"tid":%d,"ts":' % (dev, stream)
        nodes.append((code, cat, name, stream, tail, nbytes, head, mid, tail_bytes, flow_mid))
    used = sorted({node[3] for node in nodes})
    return Template(nodes, variants, used)


def _moved_to_lane(name: str, stream: int, tail: dict) -> tuple[int, dict]:
    """Where torch's export with graph_lanes="all" writes a graphed node: its annotation's
    lane (the values it adds are strings), the hardware stream kept in `original_stream`."""
    kind = "symm" if name in (N.SYMM_BARRIER[0], N.SYMM_ALLREDUCE[0]) else \
        "nccl" if name.startswith("ncclDevKernel") else None
    if kind is None:
        return DEFAULT_GRAPH_LANE, {**tail, "original_stream": stream}
    lane, description = NAMED_GRAPH_LANES[kind]
    return lane, {**tail, "Process Group Description": description, "original_stream": stream}


# ---------------------------------------------------------------------------
# gpu_user_annotation projection
# ---------------------------------------------------------------------------

class Region:
    """A record_function region projected onto the GPU streams it touched."""

    __slots__ = ("name", "ext", "d")

    def __init__(self, name: str, ext: int):
        self.name = name
        self.ext = ext
        self.d: dict[int, list[int]] = {}

    def emit(self, stream: int, c: list[int], out: list, dev: int) -> None:
        # Kineto starts the annotation 1 ns before its first kernel and ends it 1 ns after.
        out.append({"ph": "X", "cat": "gpu_user_annotation", "name": self.name, "pid": dev,
                    "tid": stream, "ts": c[0] - 1, "dur": c[1] - c[0] + 2,
                    "args": {"External id": self.ext}})

    def cover(self, stream: int, start: int, end: int, gap: int, out: list, dev: int) -> None:
        """Extend this region's span on `stream` over [start, end]; a gap wider than `gap`
        closes the current fragment and starts a new one."""
        span = self.d.get(stream)
        if span is None:
            self.d[stream] = [start, end]
        elif start - span[1] > gap:
            self.emit(stream, span, out, dev)
            self.d[stream] = [start, end]
        elif end > span[1]:
            span[1] = end

    def close(self, out: list, dev: int) -> None:
        for stream, c in self.d.items():
            self.emit(stream, c, out, dev)
        self.d = {}


class SilentRegion(Region):
    """A region the profiler does not record (no ProfilerStep without prof.step())."""

    __slots__ = ()

    def emit(self, stream: int, c: list[int], out: list, dev: int) -> None:
        pass


# ---------------------------------------------------------------------------
# The per-rank renderer
# ---------------------------------------------------------------------------

class TraceGenerator:
    """Generates one rank's trace: ``header()`` and ``chunks()`` (lists of raw events)."""

    def __init__(self, cfg: GeneratorConfig):
        self.cfg = cfg
        self.pid = cfg.pid
        self.tid_main = self.pid
        self.tid_bwd = self.pid + 67
        self.dev = cfg.gpu_device
        self.rng = random.Random(f"cgtrace-render:{cfg.seed}:{cfg.rank}")
        self.corr = 1 + self.rng.randrange(100, 5000)
        self.ext = 1 + self.rng.randrange(0, 50)
        self.ev_idx = 0
        self.py_id = 1
        self.seq = self.rng.randrange(1000, 90000)
        self.templates: dict[int, Template] = {}
        self.streams_used: set[int] = set()
        self.threads_used = {self.tid_main}
        self.gap = cfg.annotation_gap_ns if cfg.annotation_gaps else _NEVER
        self.cut = _NEVER
        self.first_step: Optional[PlannedStep] = None  # for a ProfilerStep over every step
        self.events = 0
        self._init_layout()

    # --- layout: clocks, pipeline, process groups ----------------------------
    def _init_layout(self) -> None:
        cfg = self.cfg
        origin = cfg.base_time_ns
        if cfg.pipelined:
            self.pipeline = cfg.my_pipeline
            self.group = list(cfg.pipeline_groups[self.pipeline])
            self.pp = len(self.group)
            self.schedule: Optional[dict[int, list[str]]] = pipeline_schedule(
                cfg.schedule, self.pp, cfg.microbatches, cfg.virtual_stages)
            # The pipelines simulated with this rank's (all where they share the all-reduce),
            # each with the key its plan's random streams are drawn by, and its first step's starts.
            self.job = list(range(len(cfg.pipeline_groups))) if cfg.joint_pipelines else [self.pipeline]
            self.plans: list[tuple[Union[int, str], PlanParams]] = [(q, PlanParams(cfg, q)) for q in self.job]
            self.base = origin + _rank_rng(cfg.seed, "base", cfg.rank).randint(0, 38_000 * US)
            self.step0 = [[origin + 40_000 * US + _rank_rng(cfg.seed, "start", g).randint(0, 1500 * US)
                           for g in cfg.pipeline_groups[q]] for q in self.job]
            self.my_index = cfg.pp_rank
            types = ("F", "I", "W") if cfg.schedule == "zero_bubble" else ("F", "B")
            self.graph_types = {t: i for i, t in enumerate(types)}
        else:
            self.pipeline = 0
            self.group = [cfg.rank]
            self.pp = 1
            self.schedule = None
            self.job = [0]
            self.plans = [(f"solo{cfg.rank}", PlanParams(cfg))]
            self.base = origin
            self.step0 = [[origin + self.rng.randint(1500 * US, 3000 * US)]]
            self.my_index = 0
        self.trace_start = self.base + self.rng.randint(100 * US, 900 * US)
        #: what pre-serialized times are relative to (0: absolute timestamps)
        self.tbase = self.base if cfg.time_format == "relative" else 0
        self._init_groups()

    def _init_groups(self) -> None:
        cfg = self.cfg
        w = cfg.world_size
        pgs: list[dict[str, Any]] = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                "pg_size": w, "ranks": list(range(w))}]
        self.pp_pg_name = None
        self.dp_group = [cfg.rank]
        self.dp_pg = ("0", "default_pg")
        if cfg.pipelined:
            groups = cfg.pipeline_groups
            for i, g in enumerate(groups):
                pgs.append({"pg_name": str(len(pgs)), "pg_desc": "mesh_pp", "backend_config": "cuda:nccl",
                            "pg_size": len(g), "ranks": list(g)})
                if i == self.pipeline:
                    self.pp_pg_name = pgs[-1]["pg_name"]
            if len(groups) > 1:
                for j in range(self.pp):
                    ranks = [g[j] for g in groups]
                    pgs.append({"pg_name": str(len(pgs)), "pg_desc": "mesh_dp", "backend_config": "cuda:nccl",
                                "pg_size": len(ranks), "ranks": ranks})
                    if j == self.my_index:
                        self.dp_group = ranks
                        self.dp_pg = (pgs[-1]["pg_name"], "mesh_dp")
            if cfg.pg_config_style == "single_dict":
                self.pp_pg_name = "torchtitan_real_pp"
                self.pg_config: Union[list[dict[str, Any]], dict[str, Any]] = {
                    "pg_name": "torchtitan_real_pp", "pg_desc": "mesh_pp", "backend_config": "cuda:nccl",
                    "pg_size": self.pp, "ranks": list(self.group)}
                return
        self.pg_config = pgs

    def header(self) -> dict:
        """Top-level keys before traceEvents (baseTimeNanoseconds only when relative)."""
        cfg = self.cfg
        n_dev = min(8, max(cfg.world_size, self.dev + 1))
        props = [{"id": i, **N.DEVICE_PROPERTIES} for i in range(n_dev)]
        if self.dev >= n_dev:
            props.append({"id": self.dev, **N.DEVICE_PROPERTIES})
        pgc = self.pg_config
        dist = {"backend": "nccl", "rank": cfg.rank, "world_size": cfg.world_size,
                "pg_count": 1 if isinstance(pgc, dict) else len(pgc), "pg_config": pgc,
                "nccl_version": "2.21.5"}
        h = {
            "schemaVersion": 1,
            "deviceProperties": props,
            "cupti_version": 24,
            "cuda_runtime_version": 12040,
            "cuda_driver_version": 12040,
            "distributedInfo": dist,
            "profile_memory": 1,
            "with_stack": 0,
            "record_shapes": 0,
            "trace_id": "%032X" % random.Random(f"cgtrace-id:{cfg.seed}:{cfg.rank}").getrandbits(128),
            "displayTimeUnit": "ms",
        }
        if cfg.time_format == "relative":
            h["baseTimeNanoseconds"] = self.base
        if cfg.graph_lanes == "all":
            h["cudaGraphInlineAnnotated"] = True
        return h

    @property
    def trace_name(self) -> str:
        return self.cfg.trace_name or f"/tmp/libkineto_activities_{self.pid}.json"

    # --- counters ------------------------------------------------------------
    def _ext(self) -> int:
        self.ext += 1
        return self.ext

    def _corr(self) -> int:
        self.corr += 1
        return self.corr

    # --- CPU event helpers -----------------------------------------------------
    def _cpu(self, out: list, cat: str, name: str, tid: int, ts: int, end: int, extra=None) -> int:
        """A user_annotation / cpu_op span; returns its External id."""
        ext = self._ext()
        self.ev_idx += 1
        args = {"External id": ext, "Record function id": 0}
        if extra:
            args.update(extra)
        args["Ev Idx"] = self.ev_idx
        out.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": tid,
                    "ts": ts, "dur": end - ts, "args": args})
        return ext

    def _runtime(self, out: list, name: str, cbid: int, tid: int, ts: int, end: int, ext: int,
                 flow: bool = True, cat: str = "cuda_runtime") -> int:
        corr = self._corr()
        out.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": tid,
                    "ts": ts, "dur": end - ts,
                    "args": {"External id": ext, "cbid": cbid, "correlation": corr}})
        if flow:
            out.append({"ph": "s", "id": corr, "pid": self.pid, "tid": tid, "ts": ts,
                        "cat": "ac2g", "name": "ac2g"})
        return corr

    def _memory_event(self, out: list, ts: int) -> None:
        r = self.rng
        alloc = r.randint(20, 60) << 30
        out.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                    "pid": self.pid, "tid": self.tid_main, "ts": ts,
                    "args": {"Total Reserved": alloc + (r.randint(1, 8) << 30), "Total Allocated": alloc,
                             "Bytes": r.choice((1, -1)) * (r.randint(1, 512) << 20),
                             "Addr": 0x7F0000000000 + (r.getrandbits(32) << 9),
                             "Device Id": self.dev, "Device Type": 1}})

    # --- GPU event helpers -----------------------------------------------------
    def _gpu(self, out: list, code: int, cat: str, name: str, stream: int, s: int, e: int,
             ext: int, corr: int, tail: dict, nbytes: int, regions) -> None:
        """One eager GPU activity with its flow end, projected onto `regions`."""
        if s >= self.cut:
            return
        dev = self.dev
        args: dict[str, Any]
        if code == _KERNEL:
            args = {"External id": ext, "queued": 0, "device": dev, "context": 1, "stream": stream,
                    "correlation": corr}
            args.update(tail)
        else:
            args = {"External id": ext, "device": dev, "context": 1, "stream": stream, "correlation": corr,
                    "bytes": nbytes, "memory bandwidth (GB/s)": round(nbytes / max(1, e - s), 6)}
        out.append({"ph": "X", "cat": cat, "name": name, "pid": dev, "tid": stream,
                    "ts": s, "dur": e - s, "args": args})
        out.append({"ph": "f", "id": corr, "pid": dev, "tid": stream, "ts": s,
                    "cat": "ac2g", "name": "ac2g", "bp": "e"})
        self.streams_used.add(stream)
        gap = self.gap
        for reg in regions:
            reg.cover(stream, s, e, gap, out, dev)

    # --- graphs ----------------------------------------------------------------
    def _template(self, key: int, kind: str, layer_base: int) -> Template:
        t = self.templates.get(key)
        if t is None:
            t = build_template(self.cfg, key, kind, layer_base)
            self.templates[key] = t
            self.streams_used.update(t.streams)
        return t

    def _graphs_for(self, op) -> list[Template]:
        cfg = self.cfg
        n = op.n_replays
        if op.action is None:  # plain training: forward graphs first, then backward graphs
            n_fwd = (cfg.graphs_per_step + 1) // 2
            if op.graph_kind == "F":
                return [self._template(g, "F", 2 * g) for g in range(n)]
            return [self._template(n_fwd + g, "B", 2 * (n - 1 - g)) for g in range(n)]
        a = op.action
        local = a.stage // self.pp
        ti = self.graph_types.get(a.type, 0)
        first = (local * len(self.graph_types) + ti) * n
        layers_per_stage = 2 * n
        return [self._template(first + r, a.type, a.stage * layers_per_stage + 2 * r) for r in range(n)]

    def _replay(self, out: list, tm: Template, variant, g0: int, off: int, W: int, NN: int,
                ext: int, corr: int, regions) -> None:
        """All nodes of one graph replay (the hot loop: kernels and their flow
        arrows are written straight to JSON text)."""
        starts, ends, _ = variant
        dev = self.dev
        cut = self.cut
        gap = self.gap
        tb = self.tbase
        append = out.append
        r0, r1 = regions
        covers = self.cfg.graph_lanes == "none"
        for (code, cat, name, stream, tail, nbytes, head, mid, tailb, fmid), rs, re_ in zip(
                tm.nodes, starts, ends):
            s = g0 + (off + rs) * W // NN
            if s >= cut:
                continue
            e = g0 + (off + re_) * W // NN
            q, r = divmod(s - tb, 1000)
            if code == _KERNEL:
                dq, dr = divmod(e - s, 1000)
                append(b'%s%d.%03d,"dur":%d.%03d,"args":{"External id":%d%s%d%s'
                       % (head, q, r, dq, dr, ext, mid, corr, tailb))
            else:
                args = {"External id": ext, "device": dev, "context": 1, "stream": stream,
                        "correlation": corr, "bytes": nbytes,
                        "memory bandwidth (GB/s)": round(nbytes / max(1, e - s), 6)}
                args.update(tail)
                append({"ph": "X", "cat": cat, "name": name, "pid": dev, "tid": stream,
                        "ts": s, "dur": e - s, "args": args})
            append(b'{"ph":"f","id":%d%s%d.%03d%s' % (corr, fmid, q, r, _FLOW_END))
            if covers:  # torch's laned export drops annotations left on streams without work
                r0.cover(stream, s, e, gap, out, dev)
                r1.cover(stream, s, e, gap, out, dev)

    # --- operations --------------------------------------------------------------
    def _op_compute(self, op, out: list, step_region: Region) -> None:
        cfg, rng = self.cfg, self.rng
        cs, ce = op.cpu_start, op.cpu_end
        main = self.tid_main
        ann = self._cpu(out, "user_annotation", op.label, main, cs, ce)
        region = Region(op.label, ann)
        self._memory_event(out, cs + 1 * US)
        if op.thread == "bwd":
            tid = self.tid_bwd
            self.threads_used.add(tid)
            self.seq += 1
            a0, a1 = cs + 3 * US, ce - 2 * US
            self._cpu(out, "cpu_op", "autograd::engine::evaluate_function: CompiledFunctionBackward",
                      tid, a0, a1, {"Sequence number": self.seq, "Fwd thread id": 1})
            launch_ext = self._cpu(out, "cpu_op", "CompiledFunctionBackward", tid, a0 + 1 * US, a1 - 1 * US,
                                   {"Sequence number": self.seq, "Fwd thread id": 1})
            lo, hi = a0 + 2 * US, a1 - 2 * US
        else:
            tid, launch_ext = main, ann
            lo, hi = cs + 3 * US, ce - 2 * US
        graphs = self._graphs_for(op)
        # Natural GPU layout: [input copy] + replay, per graph.
        layout = []
        pos = 0
        for tm in graphs:
            mc = rng.randint(3 * US, 12 * US) if cfg.include_memcpy else 0
            var = tm.variants[rng.randrange(len(tm.variants))]
            layout.append((pos, mc, tm, var, pos + mc + (2 * US if mc else 0)))
            pos += mc + (2 * US if mc else 0) + var[2] + 3 * US
        NN = max(1, pos)
        g0 = op.gpu_start
        W = op.gpu_end - g0
        slot = (hi - lo) // len(graphs)
        regions = (region, step_region)
        for j, (mpos, mc, tm, var, gpos) in enumerate(layout):
            a = lo + j * slot
            if mc:
                cext = self._cpu(out, "cpu_op", "aten::copy_", tid, a + slot * 5 // 100, a + slot * 35 // 100)
                corr = self._runtime(out, "cudaMemcpyAsync", N.CBID_MEMCPY_ASYNC, tid,
                                     a + slot * 10 // 100, a + slot * 30 // 100, cext)
                s = g0 + mpos * W // NN
                e = g0 + (mpos + mc) * W // NN
                self._gpu(out, _MEMCPY, "gpu_memcpy", N.MEMCPY_DTOD, LANE_STREAMS[COMPUTE], s, e,
                          cext, corr, {}, rng.randint(1, 64) << 16, regions)
            corr = self._runtime(out, "cudaGraphLaunch", N.CBID_GRAPH_LAUNCH, tid,
                                 a + slot * 45 // 100, a + slot * 85 // 100, launch_ext)
            self._replay(out, tm, var, g0, gpos, W, NN, launch_ext, corr, regions)
        region.close(out, self.dev)

    def _op_collective(self, op, out: list, step_region: Region) -> None:
        cs, ce = op.cpu_start, op.cpu_end
        main = self.tid_main
        regions = [step_region]
        if op.label:
            ann = self._cpu(out, "user_annotation", op.label, main, cs, ce)
            regions.append(Region(op.label, ann))
            r0, r1 = cs + 2 * US, ce - 2 * US
        else:
            r0, r1 = cs, ce
        kind = op.kind
        extra_peer = {}
        if kind == "p2p":
            t = op.action.type
            peer_stage = op.action.stage + (1 if t in ("SEND_F", "RECV_B") else -1)
            peer = peer_stage % self.pp
            coll = "send" if t.startswith("SEND") else "recv"
            kname, grid, block, regs = N.NCCL_SENDRECV
            ranks, pg = self.group, (self.pp_pg_name, "mesh_pp")
            me = self.my_index
            nelems = 8 * 1024 * 1024
            extra_peer = {"Dst Rank": peer} if coll == "send" else {"Src Rank": peer}
        elif kind == "allgather":
            coll, (kname, grid, block, regs) = "_allgather_base", N.NCCL_ALLGATHER
            ranks, pg, me = self.dp_group, self.dp_pg, self.dp_group.index(self.cfg.rank)
            nelems = 48 * 1024 * 1024
        elif kind == "reducescatter":
            coll, (kname, grid, block, regs) = "_reduce_scatter_base", N.NCCL_REDUCESCATTER
            ranks, pg, me = self.dp_group, self.dp_pg, self.dp_group.index(self.cfg.rank)
            nelems = 48 * 1024 * 1024
        elif kind == "allreduce":
            coll, (kname, grid, block, regs) = "allreduce", N.NCCL_ALLREDUCE
            if self.cfg.allreduce_over == "dp":
                ranks, pg, me = self.dp_group, self.dp_pg, self.dp_group.index(self.cfg.rank)
            else:
                ranks, pg, me = list(range(self.cfg.world_size)), ("0", "default_pg"), self.cfg.rank
            nelems = 1
        else:  # broadcast
            coll, (kname, grid, block, regs) = "broadcast", N.NCCL_BROADCAST
            ranks, pg, me = list(range(self.cfg.world_size)), ("0", "default_pg"), self.cfg.rank
            nelems = 1024
        n_in = nelems // len(ranks) if coll == "_allgather_base" else nelems
        n_out = nelems // len(ranks) if coll == "_reduce_scatter_base" else nelems
        meta = {"Collective name": coll, "dtype": "Float" if coll == "allreduce" else "BFloat16",
                "In msg nelems": n_in, "Out msg nelems": n_out, "Group size": len(ranks),
                "Process Group Name": pg[0], "Process Group Description": pg[1],
                "Process Group Ranks": "[" + ", ".join(map(str, ranks)) + "]"}  # as text, as Kineto writes it
        rext = self._cpu(out, "cpu_op", "record_param_comms", main, r0, r1,
                         {**meta, "Rank": me, **extra_peer})
        self._runtime(out, "cudaStreamWaitEvent", N.CBID_STREAM_WAIT_EVENT, main, r0 + 2 * US, r0 + 4 * US,
                      rext, flow=False)
        corr = self._runtime(out, "cudaLaunchKernel", N.CBID_LAUNCH_KERNEL, main, r0 + 5 * US, r1 - 2 * US, rext)
        tail = _kernel_tail(self.rng, grid, block, regs, 0)
        tail.update(meta)
        tail.update(extra_peer)
        self._gpu(out, _KERNEL, "kernel", kname, LANE_STREAMS[op.lane], op.gpu_start, op.gpu_end,
                  rext, corr, tail, 0, regions)
        if op.label:
            regions[1].close(out, self.dev)

    def _op_reshard(self, op, out: list) -> None:
        cs, ce = op.cpu_start, op.cpu_end
        if op.label:
            self._cpu(out, "user_annotation", op.label, self.tid_main, cs, ce)
        self._cpu(out, "cpu_op", "aten::resize_", self.tid_main, cs + 2 * US, ce - 2 * US)

    def _op_h2d(self, op, out: list, step_region: Region) -> None:
        cs, ce, main = op.cpu_start, op.cpu_end, self.tid_main
        self._cpu(out, "cpu_op", "aten::to", main, cs, ce)
        self._cpu(out, "cpu_op", "aten::_to_copy", main, cs + 1 * US, ce - 1 * US)
        ext = self._cpu(out, "cpu_op", "aten::copy_", main, cs + 2 * US, ce - 2 * US)
        corr = self._runtime(out, "cudaMemcpyAsync", N.CBID_MEMCPY_ASYNC, main, cs + 4 * US, ce - 3 * US, ext)
        self._gpu(out, _MEMCPY, "gpu_memcpy", N.MEMCPY_HTOD, LANE_STREAMS[COMPUTE], op.gpu_start, op.gpu_end,
                  ext, corr, {}, 8 * 8192 * 8, (step_region,))

    def _op_optimizer(self, op, out: list, step_region: Region) -> None:
        cfg, rng = self.cfg, self.rng
        cs, ce, main = op.cpu_start, op.cpu_end, self.tid_main
        ann = self._cpu(out, "user_annotation", op.label, main, cs, ce)
        region = Region(op.label, ann)
        regions = (region, step_region)
        items: list[tuple[Optional[str], str, Optional[tuple[int, int, int]], Optional[tuple[int, int, int]],
                          Optional[int]]] = list(N.OPTIMIZER_STEPS)
        if cfg.include_memset:
            items.insert(0, ("aten::zero_", N.MEMSET, None, None, None))
        k = len(items)
        lo, hi = cs + 3 * US, ce - 2 * US
        slot = (hi - lo) // k
        weights = [rng.uniform(0.5, 1.5) for _ in items]
        total = sum(weights)
        W = op.gpu_end - op.gpu_start
        acc = 0.0
        for j, (cpu_name, kname, grid, block, regs) in enumerate(items):
            a = lo + j * slot
            s = op.gpu_start + int(W * acc / total) + (1 * US if j else 0)
            acc += weights[j]
            e = op.gpu_start + int(W * acc / total)
            if kname == N.MEMSET:
                assert cpu_name is not None  # aten::zero_
                ext = self._cpu(out, "cpu_op", cpu_name, main, a + slot // 20, a + slot * 9 // 10)
                fext = self._cpu(out, "cpu_op", "aten::fill_", main, a + slot // 10, a + slot * 8 // 10)
                corr = self._runtime(out, "cudaMemsetAsync", N.CBID_MEMSET_ASYNC, main,
                                     a + slot * 2 // 10, a + slot * 7 // 10, fext)
                self._gpu(out, _MEMSET, "gpu_memset", N.MEMSET, LANE_STREAMS[COMPUTE], s, e, fext, corr,
                          {}, 4 << 20, regions)
                continue
            tail = _kernel_tail(rng, grid, block, regs, 0)
            if cpu_name is None:  # Triton kernel: launched through the driver API
                corr = self._runtime(out, "cuLaunchKernel", N.CBID_CU_LAUNCH_KERNEL, main,
                                     a + slot * 2 // 10, a + slot * 7 // 10, ann, cat="cuda_driver")
                self._gpu(out, _KERNEL, "kernel", kname, LANE_STREAMS[COMPUTE], s, e, ann, corr, tail, 0, regions)
            else:
                ext = self._cpu(out, "cpu_op", cpu_name, main, a + slot // 20, a + slot * 9 // 10)
                corr = self._runtime(out, "cudaLaunchKernel", N.CBID_LAUNCH_KERNEL, main,
                                     a + slot * 2 // 10, a + slot * 8 // 10, ext)
                self._gpu(out, _KERNEL, "kernel", kname, LANE_STREAMS[COMPUTE], s, e, ext, corr, tail, 0, regions)
        region.close(out, self.dev)

    def _op_sync(self, op, out: list, step_region: Region) -> None:
        cs, ce, main = op.cpu_start, op.cpu_end, self.tid_main
        self._cpu(out, "cpu_op", "aten::item", main, cs, ce)
        ext = self._cpu(out, "cpu_op", "aten::_local_scalar_dense", main, cs + 1 * US, ce - 1 * US)
        corr = self._runtime(out, "cudaMemcpyAsync", N.CBID_MEMCPY_ASYNC, main, cs + 3 * US, cs + 12 * US, ext)
        self._runtime(out, "cudaStreamSynchronize", N.CBID_STREAM_SYNC, main, cs + 14 * US, ce - 3 * US,
                      ext, flow=False)
        self._gpu(out, _MEMCPY, "gpu_memcpy", N.MEMCPY_DTOH, LANE_STREAMS[COMPUTE], op.gpu_start, op.gpu_end,
                  ext, corr, {}, 4, (step_region,))

    # --- steps ---------------------------------------------------------------------
    def _python(self, out: list, name: str, ts: int, end: int, parent: int) -> int:
        self.py_id += 1
        out.append({"ph": "X", "cat": "python_function", "name": name, "pid": self.pid, "tid": self.tid_main,
                    "ts": ts, "dur": end - ts,
                    "args": {"Python parent id": parent, "Python id": self.py_id, "Python thread": 0}})
        return self.py_id

    def _apply_cut(self, out: list) -> list:
        cut, pid = self.cut, self.pid
        kept = []
        for ev in out:
            if ev.__class__ is bytes:  # graph kernels/flows: already cut when made
                kept.append(ev)
                continue
            ts = ev["ts"]
            if ts >= cut:
                continue
            d = ev.get("dur")
            if d is not None and ev["pid"] == pid and ts + d > cut:
                ev["dur"] = cut - ts
            kept.append(ev)
        return kept

    def _render_step(self, ps: PlannedStep, last: bool) -> Iterator[list]:
        cfg = self.cfg
        ops = ps.ops
        skip = None
        if last and cfg.truncate_last_recv:
            recvs = [op for op in ops if op.kind == "p2p" and op.action is not None
                     and op.action.type.startswith("RECV")]
            if recvs:
                skip = recvs[-1]
                assert skip.gpu_start is not None  # planned
                self.cut = skip.gpu_start
        if self.first_step is None:
            self.first_step = ps
        profiler_steps = cfg.profiler_steps
        step_name = f"ProfilerStep#{(self.first_step if profiler_steps == 'one' else ps).index}"
        step_ext = self._ext()
        step_region = (SilentRegion if profiler_steps == "none" else Region)(step_name, step_ext)
        for op in ops:
            if op is skip:
                continue
            out: list = []
            kind = op.kind
            if kind == "compute":
                self._op_compute(op, out, step_region)
            elif kind in ("p2p", "allgather", "reducescatter", "allreduce", "broadcast"):
                self._op_collective(op, out, step_region)
            elif kind == "reshard":
                self._op_reshard(op, out)
            elif kind == "h2d":
                self._op_h2d(op, out, step_region)
            elif kind == "optimizer":
                self._op_optimizer(op, out, step_region)
            else:
                self._op_sync(op, out, step_region)
            if self.cut != _NEVER:
                out = self._apply_cut(out)
            yield out
        out = []
        step_region.close(out, self.dev)
        self.ev_idx += 1
        if profiler_steps == "per_iteration" or (profiler_steps == "one" and last):
            first = ps if profiler_steps == "per_iteration" else self.first_step
            out.append({"ph": "X", "cat": "user_annotation", "name": step_name, "pid": self.pid,
                        "tid": self.tid_main, "ts": first.start, "dur": ps.end - first.start,
                        "args": {"External id": step_ext, "Record function id": 0, "Ev Idx": self.ev_idx}})
        top = self._python(out, "train.py(241): train_step", ps.start + 4 * US, ps.end - 3 * US, 0)
        actions = [op for op in ops if op.action is not None]
        if actions:
            self._python(out, "torch/distributed/pipelining/schedules.py(1452): step",
                         actions[0].cpu_start - 2 * US, actions[-1].cpu_end + 1 * US, top)
        for op in ops:
            if op.kind == "optimizer":
                self._python(out, "torch/optim/optimizer.py(493): wrapper",
                             op.cpu_start - 1 * US, op.cpu_end + 1 * US, top)
        if self.cut != _NEVER:
            out = self._apply_cut(out)
        yield out

    def _estimate(self, ps: PlannedStep) -> int:
        n = 0
        for op in ps.ops:
            n += 10 + (op.n_replays * (2 * self.cfg.kernels_per_replay + 4) if op.kind == "compute" else 0)
        return n

    def chunks(self) -> Iterator[list]:
        """All trace events, op by op, as lists of raw event dicts (absolute int-ns times)."""
        cfg = self.cfg
        starts = [list(begins) for begins in self.step0]
        keys, params = [key for key, _ in self.plans], [p for _, p in self.plans]
        step = 0
        prev_count = None
        last_end = self.trace_start
        while True:
            planned = plan_job_step(step, starts, self.schedule, params, keys)
            mine = planned[self.job.index(self.pipeline)][self.my_index]
            if cfg.target_events is None:
                last = step == cfg.steps - 1
            else:
                est = prev_count if prev_count is not None else self._estimate(mine)
                last = self.events + est >= cfg.target_events
            before = self.events
            for chunk in self._render_step(mine, last):
                self.events += len(chunk)
                yield chunk
            prev_count = self.events - before
            last_end = mine.end
            if last or (cfg.target_events is not None and self.events >= cfg.target_events):
                break
            starts = [[next_start(p, cfg.seed, q, i) for i, p in enumerate(pipeline)]
                      for q, pipeline in zip(self.job, planned)]
            step += 1
        end = min(last_end + self.rng.randint(100 * US, 400 * US), self.cut)
        yield self._trailer(end)

    def _trailer(self, end: int) -> list:
        """Process/thread metadata, the profiler span and the window markers (Kineto's tail)."""
        t0, pid, dev, cfg = self.trace_start, self.pid, self.dev, self.cfg
        out = []

        def meta(name, p, tid, args):
            out.append({"name": name, "ph": "M", "ts": t0, "pid": p, "tid": tid, "args": args})

        meta("process_name", pid, 0, {"name": "python"})
        meta("process_labels", pid, 0, {"labels": "CPU"})
        meta("process_sort_index", pid, 0, {"sort_index": pid})
        meta("process_name", dev, 0, {"name": "python"})
        meta("process_labels", dev, 0, {"labels": f"GPU {dev}"})
        meta("process_sort_index", dev, 0, {"sort_index": 5000000 + dev})
        for tid in sorted(self.threads_used):
            tname = "python" if tid == self.tid_main else "pt_autograd_0"
            meta("thread_name", pid, tid, {"name": f"thread {tid} ({tname})"})
            meta("thread_sort_index", pid, tid, {"sort_index": tid})
        lane_names = {lane: name for lane, name in NAMED_GRAPH_LANES.values()} if cfg.graph_lanes == "all" else {}
        for s in sorted(self.streams_used):
            meta("thread_name", dev, s, {"name": lane_names.get(s, f"stream {s}")})
            meta("thread_sort_index", dev, s, {"sort_index": s})
        out.append({"ph": "X", "cat": "Trace", "ts": t0, "dur": end - t0, "pid": "Spans",
                    "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)", "args": {"Op count": 0}})
        out.append({"name": "process_sort_index", "ph": "M", "ts": t0, "pid": "Spans", "tid": 0,
                    "args": {"sort_index": 536870912}})
        out.append({"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces",
                    "tid": "Trace PyTorch Profiler", "ts": t0})
        out.append({"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": end})
        self.events += len(out)
        return out


def _rank_rng(seed: int, what: str, rank: int) -> random.Random:
    return random.Random(f"cgtrace-{what}:{seed}:{rank}")


def iter_events(cfg: GeneratorConfig) -> Iterator[dict]:
    """Stream the trace's events as dicts (constant memory), exactly as a JSON
    parser reads them from the written file: ``ts``/``dur`` are float
    microseconds, relative to ``baseTimeNanoseconds`` for
    ``time_format="relative"`` and absolute otherwise (a float cannot hold an
    absolute nanosecond timestamp exactly; the file's text can -- see
    :func:`~converter.generator.writer.write_trace`).
    """
    gen = TraceGenerator(cfg)
    base = gen.tbase
    loads = orjson.loads
    for chunk in gen.chunks():
        for ev in chunk:
            if ev.__class__ is bytes:
                yield loads(ev)
                continue
            ev["ts"] = (ev["ts"] - base) / 1000
            d = ev.get("dur")
            if d is not None:
                ev["dur"] = d / 1000
            yield ev
