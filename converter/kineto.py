"""Kineto's vocabulary: the categories, names and conventions of PyTorch profiler traces.

Every stage that needs to know what a Kineto trace means asks here, so a rule (what a
ProfilerStep is, where a CUDA-graph kernel carries its label) is written once.
"""

from __future__ import annotations

import re
from typing import Any, Callable, NamedTuple, Optional

import msgspec

from .errors import CgtraceError

# GPU activity (current names, then the 2021 ones) and the record_function regions projected
# onto GPU streams; the lane rules start from these and may change them.
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset")
GPU_ANNOTATION_CATEGORIES = ("gpu_user_annotation",)
KERNEL_CATEGORIES = ("kernel", "Kernel")
MEMORY_EVENT = "[memory]"  # an allocation or free, as an instant (profile_memory=True)
MEMCPY_CATEGORIES = ("gpu_memcpy", "Memcpy")
CPU_DEVICE = -1  # a [memory] event's Device Id for host memory


def device_name(device: int) -> str:
    """"CPU" for host memory, else "GPU <n>", as Kineto labels its GPU processes."""
    return "CPU" if device == CPU_DEVICE else f"GPU {device}"


def memcpy_direction(name: str) -> str:
    """A copy's direction as Kineto names it: "Memcpy HtoD (Pageable -> Device)" is HtoD. The
    name is the only place Kineto writes the copy's kind; a name of another shape is "other"."""
    words = name.split()
    return words[1] if len(words) > 1 and words[0] == "Memcpy" else "other"
CUDA_GRAPH_LAUNCH = "cudaGraphLaunch"
# The pids Kineto makes up for its own bookkeeping: the profiler's span ("Spans"), and its
# trace markers ("Traces"); no OS process is behind them.
BOOKKEEPING_PIDS = frozenset({"Spans", "Traces"})
# torch 2.15's export_chrome_trace(..., graph_lanes="all") marks traces whose CUDA-graph work
# it already moved onto annotation-named lanes (the real stream kept in args.original_stream).
INLINE_LANED = "cudaGraphInlineAnnotated"

# What a CPU rank's ops mean, for every stage that tells work from waiting (the UI's counters,
# the report's stage compute, the critical path): communication ops (their time is a transfer
# or a wait for one, never compute), the receives among them, and the buffers a transfer
# allocates or detaches (bookkeeping of the transfer, not compute).
NCCL_OP = "nccl:"  # the CPU op (a user annotation) around an NCCL kernel's launch: nccl:all_reduce, ...
COMMUNICATION_OPS = ("c10d::", "gloo:", NCCL_OP, "record_param_comms")
RECEIVE_OPS = ("c10d::recv", "gloo:recv", "nccl:recv")
TRANSFER_BUFFERS = ("aten::empty", "aten::detach", "detach")
CPU_OP_CATEGORY = "cpu_op"
OP_CATEGORIES = (CPU_OP_CATEGORY, "Operator")  # a CPU op, as current and 2021 traces name its category
RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver", "Runtime")  # CUDA API calls: launches, copies, syncs
# Runtime calls in which the host waits for the GPU to finish work (not cudaStreamWaitEvent: a stream waits there).
HOST_SYNCHRONISATIONS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")
ANNOTATION_CATEGORY = "user_annotation"  # a record_function region on the CPU
NCCL_KERNEL_PREFIXES = ("ncclKernel_", "ncclDevKernel_")  # an NCCL collective's (or send's, receive's) kernel
POINT_TO_POINT = ("send", "recv")  # the "Collective name" of a pairwise NCCL op: no collective across ranks
# Bytes per element of the dtypes Kineto records: c10's ScalarType names on kernels, C++ type
# names in an op's Input type.
DTYPE_BYTES = {
    "Bool": 1, "Byte": 1, "Char": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1,
    "Short": 2, "Half": 2, "BFloat16": 2, "Int": 4, "Float": 4, "UInt32": 4, "Long": 8, "Double": 8, "UInt64": 8,
    "ComplexHalf": 4, "ComplexFloat": 8, "ComplexDouble": 16,
    "bool": 1, "unsigned char": 1, "signed char": 1, "short int": 2, "c10::Half": 2, "c10::BFloat16": 2, "int": 4,
    "float": 4, "long int": 8, "double": 8, "c10::complex<float>": 8, "c10::complex<double>": 16,
}
MODULE_PREFIX = "nn.Module: "  # a python_function slice of an nn.Module's forward (with_stack traces)


def is_communication_op(name: str) -> bool:
    """A CPU op or span that moves data between ranks (or waits for it)."""
    return name.startswith(COMMUNICATION_OPS)


def is_cpu_compute(name: str, category: str) -> bool:
    """A CPU slice that counts as compute on a CPU-only rank: a cpu_op that is no communication
    op and no transfer buffer (time a communication op runs inside it is taken off apart)."""
    return category == CPU_OP_CATEGORY and not is_communication_op(name) and not name.startswith(TRANSFER_BUFFERS)


MAX_NS = (1 << 63) - 1  # Perfetto timestamps are int64 ns: beyond, trace_processor drops or wraps them
PROFILER_STEP_PREFIX = "ProfilerStep#"  # a profiler step's slice: the prefix, then its number
_PROFILER_STEP = re.compile(rf"^{PROFILER_STEP_PREFIX}(\d{{1,18}})$")  # more digits are no step number int() takes
# The schedule actions that compute (torch.distributed.pipelining's F, B, I, W); the rest move
# data (SEND_*, RECV_*) or shard (UNSHARD, RESHARD, REDUCE_GRAD).
COMPUTE_ACTIONS = ("F", "B", "I", "W")
# ScheduleGPipe's record_function names: no stage (it is the rank's PP rank), no send or receive.
STAGELESS_PATTERN = re.compile(r"^(?P<action>Forward|Backward) (?P<microbatch>\d{1,18})$")


def is_number(digits: str) -> bool:
    """Whether a PP pattern's stage or microbatch text is one: user patterns may allow any
    digits, and one beyond int64 is no stage."""
    return len(digits) <= 18


_THREAD_NAME = re.compile(r"thread (-?\d+) \((.+)\)")  # Kineto's thread names hold the tid


def kineto_thread_name(name: str, tid: Any) -> Optional[str]:
    """The name inside Kineto's "thread <tid> (<name>)" where `name` is that form for `tid`."""
    match = _THREAD_NAME.fullmatch(name)
    return match.group(2) if match and match.group(1) == str(tid) else None


def joined_names(names: list[str], tid: Any = None) -> str:
    """One title for a process or thread the input named more than once (Kineto renames a
    thread that takes a new role: "pt_main_thread", then "pt_autograd_0", both at one time):
    every distinct name, in text order, as the input's order says nothing a reader of any
    order could keep. Thread names in Kineto's form for `tid` stay in it, their names inside."""
    distinct = sorted(set(names))
    if len(distinct) == 1:  # what either form below gives for one name (a thread per replay stream)
        return distinct[0]
    inner = [] if tid is None else [part for name in distinct if (part := kineto_thread_name(name, tid)) is not None]
    if tid is not None and len(inner) == len(distinct):
        return f"thread {tid} ({' / '.join(sorted(inner))})"
    return " / ".join(distinct)


def profiler_step(name: str) -> Optional[int]:
    """The step number of a `ProfilerStep#N` slice name, else None."""
    match = _PROFILER_STEP.match(name)
    return int(match.group(1)) if match else None


def base_time_ns(metadata: dict) -> Optional[int]:
    """The header's `baseTimeNanoseconds` (an int, or its digits as text), None when absent.
    Any other value would shift every event out of range or overflow int64: CgtraceError."""
    base = metadata.get("baseTimeNanoseconds")
    if base is None:
        return None
    if isinstance(base, str) and base.strip().isascii() and base.strip().isdigit() and len(base.strip()) <= 19:
        base = int(base)  # more digits are beyond int64, and past 4,300 more than int() reads
    if type(base) is not int or not 0 <= base <= MAX_NS:
        raise CgtraceError(f"baseTimeNanoseconds {base!r:.40} is not a time in ns (0 to {MAX_NS}); "
                           "fix it in the trace's header or remove it")
    return base


def group_ranks(value: Any) -> Optional[tuple[int, ...]]:
    """A collective's "Process Group Ranks" arg as ranks: real Kineto writes the list as text
    ("[0, 1]"), other writers as a JSON list; None where it is neither."""
    if isinstance(value, str):
        try:
            value = msgspec.json.decode(value)
        except msgspec.DecodeError:
            return None
    if isinstance(value, list) and all(is_rank(rank) for rank in value):
        return tuple(value)
    return None


MAX_RANK = (1 << 31) - 1  # torch.distributed ranks are int32; a larger one overflows every int64 column


def is_rank(value: Any) -> bool:
    """A torch.distributed rank: an int from 0 to MAX_RANK (JSON's `true` is no rank, though
    Python's bool is an int)."""
    return type(value) is int and 0 <= value <= MAX_RANK


class RankHeader(msgspec.Struct, frozen=True):
    """The header's `distributedInfo` as the engine and jobs need it, read once per trace.

    `rank` is None when the header names no usable rank; `problem` then says why and what to
    do, for a merge, which needs one. A trace without a rank still converts and compacts."""

    rank: Optional[int]
    world_size: Optional[int]
    pp_group: Optional[tuple[int, ...]]   # the ranks of this rank's PP group, in pipeline order
    has_distributed_info: bool
    problem: Optional[str] = None
    # pg_config lists only groups of the whole world (default_pg): a 1-D mesh, where the world is
    # the pipeline and the global rank order its PP order (torch lists no mesh_pp then)
    one_dimensional: bool = False

    @property
    def pp_rank(self) -> int:
        """Its place in the PP group, or in a 1-D world its global rank (else 0)."""
        if self.pp_group and self.rank is not None:
            return self.pp_group.index(self.rank)
        return self.rank if self.one_dimensional and self.rank is not None else 0

    @property
    def pp_rank_source(self) -> str:
        """Where `pp_rank` came from, as the summary says it."""
        if self.pp_group:
            return "distributedInfo.pg_config"
        if not self.has_distributed_info:
            return "default: no distributedInfo"
        if self.one_dimensional:
            return "global rank: a 1-D world (only default_pg in distributedInfo.pg_config)"
        return "default: no PP group in distributedInfo.pg_config"


_NO_RANK = "no distributedInfo.rank; a merge needs traces from torch.distributed runs (or pass only such files)"


def rank_header(metadata: dict, source: str) -> RankHeader:
    """`distributedInfo` read once: rank, world size and PP group. A PP group whose ranks are not
    distinct rank numbers cannot order a pipeline: CgtraceError naming `source`."""
    info = metadata.get("distributedInfo")
    if not isinstance(info, dict) or "rank" not in info:
        return RankHeader(None, None, None, has_distributed_info=isinstance(info, dict), problem=_NO_RANK)
    rank, world_size = info["rank"], info.get("world_size")
    invalid = [(name, value) for name, value in (("rank", rank), ("world_size", world_size))
               if not (is_rank(value) or (name == "world_size" and value is None))]
    problem = next((f"distributedInfo.{name} is {value!r:.40}, not an integer from 0 to {MAX_RANK}; fix the trace's "
                    "header"
                    for name, value in invalid), None)
    usable_rank = rank if is_rank(rank) else None
    config = info.get("pg_config")
    groups = _groups(config)
    one_dimensional = bool(groups) and is_rank(world_size) and all(
        isinstance(group.get("ranks"), list) and len(group["ranks"]) == world_size for group in groups)
    return RankHeader(usable_rank, world_size if is_rank(world_size) else None,
                      _pp_group(config, usable_rank, source), True, problem, one_dimensional)


def _pp_group(config: Any, rank: Optional[int], source: str) -> Optional[tuple[int, ...]]:
    """The ranks of the PP group containing `rank`: pg_desc "mesh_pp" or pg_name "torchtitan_real_pp"."""
    if rank is None:
        return None
    for group in _groups(config):
        if group.get("pg_desc") == "mesh_pp" or group.get("pg_name") == "torchtitan_real_pp":
            ranks = group.get("ranks")
            if not (isinstance(ranks, list) and all(map(is_rank, ranks)) and len(set(ranks)) == len(ranks)):
                raise CgtraceError(f"{source}: distributedInfo.pg_config PP group ranks {ranks!r:.60} are not "
                                   "distinct rank numbers; fix the trace's header")
            if rank in ranks:
                return tuple(ranks)
    return None


def _groups(config: Any) -> list[dict]:
    """pg_config's groups: it may be a list of groups or a single one."""
    return [group for group in (config if isinstance(config, list) else [config]) if isinstance(group, dict)]


def inline_laned(metadata: dict) -> bool:
    """Whether the trace's exporter already laned its CUDA-graph work (see INLINE_LANED)."""
    return metadata.get(INLINE_LANED) is True


class _Named(msgspec.Struct):
    name: Any = None


class _Moved(msgspec.Struct):
    original_stream: Any = None


_decode_name = msgspec.json.Decoder(_Named).decode
_decode_moved = msgspec.json.Decoder(_Moved).decode
# The keys as they appear in args text: each label function's quick test and its rule's marker.
_NAME_KEY, _ORIGINAL_STREAM_KEY = b'"name"', b'"original_stream"'


def kernel_label(args: Optional[bytes]) -> Optional[str]:
    """args.name when it is a non-empty string: where CUDA-graph kernels carry the label of the
    region they were captured in. `args` is the raw JSON text of a slice's args."""
    if args is None or _NAME_KEY not in args:
        return None
    try:
        name = _decode_name(args).name  # skips the other keys: a third of decoding them all
    except msgspec.MsgspecError:  # not an object, or a number beyond range
        return None
    return name if type(name) is str and name else None


def is_correlation(value: object) -> bool:
    """Whether an args.correlation value is an id CUPTI gives: an int, not negative, within an
    int64 (as a trace processor stores it)."""
    return type(value) is int and 0 <= value < 1 << 63


class _Launched(msgspec.Struct):
    correlation: Any = None
    stream: Any = None


_decode_launched = msgspec.json.Decoder(_Launched).decode


def launch_keys(args: Optional[bytes]) -> tuple[Optional[int], Optional[int]]:
    """A slice's args.correlation, the id CUPTI gives a runtime call and the GPU work it launched
    (a CUDA graph's replayed kernels carry their cudaGraphLaunch's), numbered in launch order,
    and its args.stream; each None where absent or not an int (an id where it is no id CUPTI
    gives: is_correlation; a stream beyond an int64's range)."""
    if args is None:
        return None, None
    try:
        found = _decode_launched(args)
    except msgspec.MsgspecError:
        return None, None
    return (found.correlation if is_correlation(found.correlation) else None,
            found.stream if type(found.stream) is int and -(1 << 63) < found.stream < 1 << 63 else None)


def original_stream(args: Optional[bytes]) -> Optional[str]:
    """args.original_stream (as text) of a slice an exporter moved onto a lane, else None."""
    if args is None or _ORIGINAL_STREAM_KEY not in args:
        return None
    try:
        stream = _decode_moved(args).original_stream
    except msgspec.MsgspecError:
        return None
    return str(stream) if type(stream) in (int, str) else None


class ArgsLabel(NamedTuple):
    """A label rule (model.args.LabelRule): `label` reads an entry's args text, and only
    args holding `marker` can have a label."""

    label: Callable[[bytes], Optional[str]]
    marker: bytes


KERNEL_LABEL = ArgsLabel(kernel_label, _NAME_KEY)
ORIGINAL_STREAM = ArgsLabel(original_stream, _ORIGINAL_STREAM_KEY)


# The args keys Kineto writes (seen in real traces and in the generator's), in a fixed order:
# the Perfetto writer numbers annotation names these first, so their numbering cannot depend on
# which event a file happens to hold first (outputs/prepared_args.py).
ARGS_KEYS = (
    "External id", "correlation", "Ev Idx", "Input Dims", "Input type", "Input Strides", "Concrete Inputs", "cbid",
    "Trace name", "Trace iteration", "Record function id", "Call stack", "stream", "device", "context",
    "Profiler Event Index", "Module Hierarchy", "grid", "block", "queued", "registers per thread", "shared memory",
    "blocks per SM", "warps per SM", "est. achieved occupancy %", "Fwd thread id", "Sequence number", "Device",
    "external id", "external ts", "Python parent id", "Python id", "Python module id", "Python thread",
    "Device Type", "Device Id", "Bytes", "Addr", "Total Allocated", "Total Reserved", "bytes",
    "memory bandwidth (GB/s)", "Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype",
    "In split size", "Out split size", "Process Group Name", "Process Group Description", "Process Group Ranks",
    "Rank", "Src Rank", "Dst Rank", "Op count", "Global rank start", "Global rank stride", "name", "labels",
    "original_stream", "kernel_hash", "kernel_file", "kernel_backend", "kernel_name", "kernel_kwargs", "num_warps",
    "num_stages",
)
