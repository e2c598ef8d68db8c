"""Configuration of the synthetic Kineto trace generator.

One :class:`GeneratorConfig` describes one rank's trace.  All times inside the
generator are integer nanoseconds; only the writer turns them into the
microsecond text Kineto writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from .schedules import pipeline_schedule

SCHEDULES = ("1f1b", "interleaved", "zero_bubble")
TIME_FORMATS = ("relative", "absolute")
PG_CONFIG_STYLES = ("list", "single_dict")
PROFILER_STEPS = ("per_iteration", "one", "none")
PP_ANNOTATIONS = ("pp", "gpipe")
GRAPH_LANES = ("none", "all")
ALLREDUCE_GROUPS = ("world", "dp")

#: A plausible profiler-start wall clock (2024-04-04), the example Kineto trace base.
DEFAULT_BASE_TIME_NS = 1_712_195_495_519_543_604


@dataclass(frozen=True)
class GeneratorConfig:
    """Everything that shapes one generated trace.  Same config -> same bytes.

    Workload (non-pipeline mode): every step replays ``graphs_per_step`` captured
    CUDA graphs (the first half under a ``forward`` region on the main thread, the
    rest under ``backward`` on the autograd thread), each replay running exactly
    ``kernels_per_replay`` GPU operations (kernels, plus memcpy/memset nodes).

    Pipeline mode (``pp_size`` set): every step runs this rank's actions of
    :func:`~converter.generator.schedules.pipeline_schedule`; each F/B/I/W action
    replays ``graphs_per_action`` graphs.  Cross-rank timing (a SEND starts before
    its RECV ends) is simulated for the whole pipeline, so per-rank traces
    generated separately agree on one absolute clock.
    """

    seed: int = 0
    steps: int = 3
    #: Keep adding steps until at least this many trace events were produced
    #: (overrides ``steps``).
    target_events: Optional[int] = None

    # --- CUDA-graph workload -------------------------------------------------
    graphs_per_step: int = 32
    kernels_per_replay: int = 48
    streams_per_graph: int = 8
    #: Probability that the next segment of a graph is a fork of 2-3 concurrent
    #: branches on different streams (instead of a sequential run).
    parallel_branch_fraction: float = 0.15
    include_nccl: bool = True
    include_memcpy: bool = True
    include_memset: bool = True
    include_symm_mem: bool = True
    #: Put per-kernel CUDA-graph labels (``args.name``, e.g. "layers.3.attention").
    kernel_labels: bool = True
    #: Split a gpu_user_annotation on one stream into fragments where that stream
    #: is idle for more than ``annotation_gap_ns`` inside the region.
    annotation_gaps: bool = False
    annotation_gap_ns: int = 100_000

    #: How the schedule annotates actions: "pp" (record_function("PP:<action>"), as
    #: torch.distributed.pipelining's schedules do) or "gpipe" (ScheduleGPipe:
    #: "Forward <mb>" / "Backward <mb>" only, no stage, nothing for send, receive or unshard).
    pp_annotations: str = "pp"
    #: How prof.step() was called: "per_iteration" (a ProfilerStep#N per step),
    #: "one" (one ProfilerStep over every step: a profile without prof.step() per
    #: iteration) or "none" (no ProfilerStep at all).
    profiler_steps: str = "per_iteration"
    #: torch 2.15's ``export_chrome_trace(..., graph_lanes=...)``: "none" keeps graphed work
    #: on its hardware streams; "all" writes it on annotation-named lanes (stream 7 unless
    #: named), the real stream in ``args.original_stream``, ``cudaGraphInlineAnnotated`` in
    #: the header, and drops GPU annotations left on streams without work.
    graph_lanes: str = "none"

    # --- output format -------------------------------------------------------
    #: "relative": ts in us relative to baseTimeNanoseconds (modern Kineto);
    #: "absolute": no baseTimeNanoseconds, ts absolute us with ns fraction.
    time_format: str = "relative"
    #: baseTimeNanoseconds of the trace.  In pipeline mode this is the job's clock
    #: origin and each rank's profiler start (its baseTimeNanoseconds) adds a
    #: seeded per-rank offset of up to 40 ms.
    base_time_ns: int = DEFAULT_BASE_TIME_NS
    trace_name: Optional[str] = None

    # --- distributed layout --------------------------------------------------
    rank: int = 0
    world_size: int = 1
    #: CUDA device index (GPU pid); default: ``rank % 8``.
    device: Optional[int] = None
    #: CPU process id; default: ``1234 + rank``.
    cpu_pid: Optional[int] = None
    #: Every pipeline's global ranks in PP order (PP rank = index in the list).
    #: Default: one pipeline ``range(pp_size)``; then ``rank`` defaults to
    #: ``pp_rank`` and ``world_size`` is raised to at least ``pp_size``.
    pp_groups: Optional[Sequence[Sequence[int]]] = None
    #: "list" (normal) or "single_dict": pg_config is the PP group as one dict
    #: named "torchtitan_real_pp".
    pg_config_style: str = "list"

    # --- pipeline parallelism (None = no pipeline) ---------------------------
    pp_size: Optional[int] = None
    pp_rank: int = 0
    schedule: str = "1f1b"
    microbatches: int = 4
    #: Virtual stages per rank (interleaved / zero_bubble); default 2 for
    #: "interleaved", 1 otherwise.
    stages_per_rank: Optional[int] = None
    graphs_per_action: int = 2
    #: Drop the last receive of the last step (capture window ends when it would
    #: start on the GPU).  Pipeline mode only.
    truncate_last_recv: bool = False
    #: A straggler: this global rank's GPU compute takes `slow_factor` times as long
    #: (the same on every rank's plan, so its pipeline's ranks agree on its timing).
    slow_rank: Optional[int] = None
    slow_factor: float = 2.0
    #: Late ranks: global rank -> how many ns later its GPU reaches each end-of-step
    #: all-reduce than its own work allows (held up by something the trace does not show).
    allreduce_delays_ns: Optional[Mapping[int, int]] = None
    #: Whether the end-of-step all-reduce spans every pipeline, as NCCL runs it: the whole job
    #: is simulated on one clock. False keeps each pipeline's simulation apart (its all-reduce
    #: ends when its own ranks arrive), as traces generated before this knob were.
    joint_pipelines: bool = False
    #: Which ranks the end-of-step all-reduce spans: "world" (the default group) or "dp"
    #: (each PP position's DP group, mesh_dp, as a gradient all-reduce does; needs joint_pipelines).
    allreduce_over: str = "world"
    #: A launch-bound run: every compute action's CPU time (its cudaGraphLaunch calls) takes
    #: `launch_factor` times as long, so from about 20 the GPUs wait for the launches.
    launch_factor: float = 1.0

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise ValueError(f"GeneratorConfig: {msg}")

        if self.steps < 1:
            bad(f"steps must be >= 1, got {self.steps}")
        if self.target_events is not None and self.target_events < 1:
            bad(f"target_events must be >= 1, got {self.target_events}")
        if self.graphs_per_step < 1:
            bad(f"graphs_per_step must be >= 1, got {self.graphs_per_step}")
        if self.kernels_per_replay < 1:
            bad(f"kernels_per_replay must be >= 1, got {self.kernels_per_replay}")
        if not 1 <= self.streams_per_graph <= 64:
            bad(f"streams_per_graph must be in 1..64, got {self.streams_per_graph}")
        if not 0.0 <= self.parallel_branch_fraction <= 1.0:
            bad("parallel_branch_fraction must be in [0, 1]")
        if self.annotation_gap_ns < 0:
            bad("annotation_gap_ns must be >= 0")
        if not self.launch_factor > 0:
            bad(f"launch_factor must be > 0, got {self.launch_factor}")
        if self.slow_rank is not None and not (0 <= self.slow_rank < self.world_size and self.slow_factor > 0):
            bad(f"slow_rank must be a global rank (0..{self.world_size - 1}) and slow_factor > 0, "
                f"got {self.slow_rank} and {self.slow_factor}")
        if any(not (0 <= rank < self.world_size and delay >= 0)
               for rank, delay in (self.allreduce_delays_ns or {}).items()):
            bad(f"allreduce_delays_ns must map global ranks (0..{self.world_size - 1}) to delays >= 0, "
                f"got {dict(self.allreduce_delays_ns or {})}")
        if self.allreduce_over not in ALLREDUCE_GROUPS or (self.allreduce_over == "dp" and not self.joint_pipelines):
            bad(f"allreduce_over must be one of {ALLREDUCE_GROUPS} ('dp' with joint_pipelines), "
                f"got {self.allreduce_over!r}")
        if self.pp_annotations not in PP_ANNOTATIONS:
            bad(f"pp_annotations must be one of {PP_ANNOTATIONS}, got {self.pp_annotations!r}")
        if self.profiler_steps not in PROFILER_STEPS:
            bad(f"profiler_steps must be one of {PROFILER_STEPS}, got {self.profiler_steps!r}")
        if self.graph_lanes not in GRAPH_LANES:
            bad(f"graph_lanes must be one of {GRAPH_LANES}, got {self.graph_lanes!r}")
        if self.time_format not in TIME_FORMATS:
            bad(f"time_format must be one of {TIME_FORMATS}, got {self.time_format!r}")
        if self.base_time_ns < 0:
            bad("base_time_ns must be >= 0")
        if self.pg_config_style not in PG_CONFIG_STYLES:
            bad(f"pg_config_style must be one of {PG_CONFIG_STYLES}")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            bad(f"need 0 <= rank < world_size, got rank={self.rank} world_size={self.world_size}")
        if self.pp_size is None:
            if self.truncate_last_recv:
                bad("truncate_last_recv needs a pipeline (pp_size)")
            return
        if self.pp_size < 1:
            bad(f"pp_size must be >= 1, got {self.pp_size}")
        if not 0 <= self.pp_rank < self.pp_size:
            bad(f"pp_rank must be in 0..{self.pp_size - 1}, got {self.pp_rank}")
        if self.pp_groups is None:
            # Default layout: one pipeline of global ranks 0..pp_size-1.
            if self.rank == 0 and self.pp_rank != 0:
                object.__setattr__(self, "rank", self.pp_rank)
            if self.world_size < self.pp_size:
                object.__setattr__(self, "world_size", self.pp_size)
        if self.schedule not in SCHEDULES:
            bad(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.microbatches < 1:
            bad(f"microbatches must be >= 1, got {self.microbatches}")
        if self.stages_per_rank is not None and self.stages_per_rank < 1:
            bad("stages_per_rank must be >= 1")
        if self.schedule == "1f1b" and self.virtual_stages != 1:
            bad("schedule '1f1b' has one stage per rank; use 'interleaved' for more")
        if self.graphs_per_action < 1:
            bad("graphs_per_action must be >= 1")
        if self.pp_annotations == "gpipe" and self.schedule != "1f1b":
            bad("pp_annotations 'gpipe' names only F and B actions: use schedule '1f1b'")
        if self.truncate_last_recv and self.pp_size < 2:
            bad("truncate_last_recv needs pp_size >= 2 (no receives otherwise)")
        try:
            pipeline_schedule(self.schedule, self.pp_size, self.microbatches, self.virtual_stages)
        except ValueError as e:
            bad(str(e))
        groups = self.pipeline_groups
        seen: set[int] = set()
        for g in groups:
            if len(g) != self.pp_size:
                bad(f"every pp group must have pp_size={self.pp_size} ranks, got {list(g)}")
            for r in g:
                if not 0 <= r < self.world_size or r in seen:
                    bad(f"pp group ranks must be distinct and < world_size: {list(g)}")
                seen.add(r)
        mine = [g for g in groups if self.rank in g]
        if len(mine) != 1:
            bad(f"rank {self.rank} must be in exactly one pp group")
        if list(mine[0]).index(self.rank) != self.pp_rank:
            bad(f"rank {self.rank} is pp rank {list(mine[0]).index(self.rank)} of its group, "
                f"but pp_rank={self.pp_rank}")

    # --- derived values ------------------------------------------------------
    @property
    def pipelined(self) -> bool:
        return self.pp_size is not None

    @property
    def virtual_stages(self) -> int:
        if self.stages_per_rank is not None:
            return self.stages_per_rank
        return 2 if self.schedule == "interleaved" else 1

    @property
    def pipeline_groups(self) -> tuple[tuple[int, ...], ...]:
        """All pipelines' global ranks in PP order."""
        if self.pp_size is None:
            return ()
        if self.pp_groups is not None:
            return tuple(tuple(int(r) for r in g) for g in self.pp_groups)
        return (tuple(range(self.pp_size)),)

    @property
    def my_pipeline(self) -> int:
        for i, g in enumerate(self.pipeline_groups):
            if self.rank in g:
                return i
        return 0

    @property
    def gpu_device(self) -> int:
        return self.rank % 8 if self.device is None else self.device

    @property
    def pid(self) -> int:
        return 1234 + self.rank if self.cpu_pid is None else self.cpu_pid

