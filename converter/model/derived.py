"""The rows cgtrace derives, kept apart from the measured ones: this module is their one home.

Every slice of the input is measured and stays as it was; a few rows are cgtrace's own
answers, drawn beside them in the UI: spans naming a run of CUDA-graph kernels, zero-length
markers where a transfer's data arrived, and a merge's critical path. A sum over `slice`
must not count them as work, so each has a category of its own, named here, which the
writers give them and every reader (trace_processor's views, the report, the self-checks)
tells them apart by. Counters (a GPU's or rank's activity, a device's memory) are derived too, but live in
trace_processor's counter table, never among slices. What launched a GPU slice is derived as
args written beside its own, under one name (ATTRIBUTION), which SQL and the report read. Why a GPU
is idle is derived as a counter per GPU whose value is a code (IDLE_CODES).
"""

from __future__ import annotations

KERNEL_LABEL = "cuda_graph_label"  # a run of kernels on one lane sharing a CUDA-graph label
ARRIVAL = "pp_p2p"                 # where a transfer's data reached its receiver (an arrow's end)
CRITICAL_PATH = "critical_path"    # a segment of a step's critical path across ranks

# What each derived category stands for, as the docs and the `cgtrace_derived_slice` view name it.
CATEGORIES = {
    KERNEL_LABEL: "kernel label span",
    ARRIVAL: "arrival marker",
    CRITICAL_PATH: "critical path segment",
}

# What a critical path segment's time was (its `kind` arg), in the order the report shows them;
# a wait is time nothing of the path ran.
COMPUTE, TRANSFER, LAUNCH, WAIT = "compute", "transfer", "launch", "wait"
PATH_KINDS = (COMPUTE, TRANSFER, LAUNCH, WAIT)

# A GPU slice's launch attribution (engine/attribution.py): args written beside the slice's own
# under this name (in SQL: debug.cgtrace_launch.<field>), each field present where the trace names it.
ATTRIBUTION = "cgtrace_launch"
LAUNCH, OP, ANNOTATION, MODULE, REASON = "launch", "op", "annotation", "module", "reason"
ATTRIBUTION_FIELDS = (LAUNCH, OP, ANNOTATION, MODULE, REASON)
# A CUDA graph replay's slice's place in its replay (1 for the first to start): the graph's order.
REPLAY_ORDER = "replay_order"
# Why a GPU slice has no launch in the trace (its REASON field), each defined once.
BEFORE_CAPTURE = "launched before the capture"
NOT_RECORDED = "launch not recorded"
NO_CPU_CALLS = "no CPU calls recorded"
NO_CORRELATION = "no correlation id"
UNATTRIBUTED_REASONS = {
    BEFORE_CAPTURE: "its correlation id is below every CPU runtime call's in the trace: CUPTI numbers launches in "
                    "order, so it was launched before the profiler began recording the CPU side",
    NOT_RECORDED: "no CPU runtime call in the trace carries its correlation id, though calls before and after it "
                  "are recorded",
    NO_CPU_CALLS: "the trace holds no CPU runtime call with a correlation id (a capture of the GPU alone), so "
                  "whether it was launched before the capture cannot be told",
    NO_CORRELATION: "it carries no correlation id (args.correlation) and no launch arrow reaches it",
}

# Why a GPU is idle (engine/waits.py), in the order a moment is given to the first that holds;
# its counter's value is the cause's code, NOT_IDLE while the GPU works or outside the trace.
QUEUED, HOST_SYNC, PEER, HOST_BEHIND, OTHER = "queued", "host sync", "peer", "host behind", "other"
IDLE_CAUSES = (QUEUED, HOST_SYNC, PEER, HOST_BEHIND, OTHER)
NOT_IDLE = 0
IDLE_CODES = {cause: code for code, cause in enumerate(IDLE_CAUSES, 1)}
