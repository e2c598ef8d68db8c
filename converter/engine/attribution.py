"""Which CPU call launched each GPU slice, and the op, record_function annotation and module
around that call, written as args on the slice: the UI shows them on a kernel, SQL reads them
(docs/sql.md, "From a kernel to its op"), the report sums GPU time by them.

A GPU slice names its launch by correlation id: CUPTI gives a runtime call and the GPU work it
launched the same `correlation` arg (a CUDA graph's replayed kernels all carry their
cudaGraphLaunch's), and Kineto draws that tie as an `ac2g` arrow. The id is taken first: the
arrow's start is bound by time (Chrome's rule), and where a zero-length call starts with the
launch (cudaPeekAtLastError beside cudaMemsetAsync, in HTA's CUDA-graph trace) it lands on that
call; the arrow serves where the id finds no call. The launch's op, annotation and
module are the innermost cpu_op, user_annotation (a ProfilerStep#N span is a step, not an
annotation) and `nn.Module: ` python_function slices on its thread that hold it; of slices with
one span, the last in the trace's canonical order (by name), as cgtrace nests them.

A GPU slice whose launch is not in the trace says why (REASON). Nothing is moved or dropped:
every GPU slice stays in every figure, and its own args stay as read: the attribution is
written beside them (the writer's extra args) under one name, model/derived.py's ATTRIBUTION,
with its fields and reasons.
"""

from __future__ import annotations

from typing import Callable

import msgspec
import numpy as np

from .. import kineto
from ..model import ExtraArgs, Trace
from ..model.columns import distinct_rows
from ..model.derived import (ATTRIBUTION, ATTRIBUTION_FIELDS, BEFORE_CAPTURE, NO_CORRELATION,
                             NO_CPU_CALLS, NOT_RECORDED, REASON, REPLAY_ORDER,
                             UNATTRIBUTED_REASONS)
from ..model.nesting import by_track_in_nesting_order
from .launch_keys import launch_keys


# Why a GPU slice has no launch, numbered in sorted order: the args' distinct values and the
# summary's counts come in that order.
_REASONS = tuple(sorted(UNATTRIBUTED_REASONS))


class Attribution(msgspec.Struct):
    """Per GPU slice (`gpu`: its rows), the rows of its launch and of the op, annotation and
    module around that launch (-1: none), and why it has no launch (its place in _REASONS, -1
    where it has one)."""

    gpu: np.ndarray
    launch: np.ndarray
    op: np.ndarray
    annotation: np.ndarray
    module: np.ndarray
    reason: np.ndarray


def attribute(trace: Trace) -> Attribution:
    """Every GPU slice's launch and what was around it on the CPU."""
    table = trace.slices
    texts = table.texts

    def of_categories(categories: tuple[str, ...]) -> np.ndarray:
        return table.in_categories(categories) & ~table.instant

    def named(wanted: Callable[[str], bool]) -> np.ndarray:
        return np.fromiter(map(wanted, texts), np.bool_, len(texts))[table.name]

    gpu, runtime = np.flatnonzero(of_categories(kineto.GPU_CATEGORIES)), np.flatnonzero(
        of_categories(kineto.RUNTIME_CATEGORIES))
    correlations = launch_keys(trace, np.concatenate([gpu, runtime]))[0]
    gpu_ids, runtime_ids = correlations[:len(gpu)], correlations[len(gpu):]
    known = runtime_ids >= 0
    ids, callers = runtime_ids[known], runtime[known]
    order = np.argsort(ids, kind="stable")
    ids, callers = ids[order], callers[order]
    launch = np.full(len(gpu), -1, np.int64)
    if len(ids):
        at = np.minimum(np.searchsorted(ids, gpu_ids), len(ids) - 1)
        found = (gpu_ids >= 0) & (ids[at] == gpu_ids)
        launch[found] = callers[at[found]]
    unlinked = launch < 0
    launch[unlinked] = _by_arrow(trace, gpu[unlinked], runtime)
    first_call = ids[0] if len(ids) else 0  # where there is no call, NO_CPU_CALLS comes first
    reason = np.select([launch >= 0, gpu_ids < 0, np.full(len(gpu), not len(ids)), gpu_ids < first_call],
                       [-1, *map(_REASONS.index, (NO_CORRELATION, NO_CPU_CALLS, BEFORE_CAPTURE))],
                       _REASONS.index(NOT_RECORDED))
    steps = named(lambda text: kineto.profiler_step(text) is not None)
    ops = np.flatnonzero(of_categories(kineto.OP_CATEGORIES) & ~steps)
    annotations = np.flatnonzero(of_categories((kineto.ANNOTATION_CATEGORY,)) & ~steps)
    modules = np.flatnonzero(named(lambda text: text.startswith(kineto.MODULE_PREFIX)) & ~table.instant)
    launches, position = np.unique(launch[launch >= 0], return_inverse=True)

    def around(containers: np.ndarray) -> np.ndarray:
        found = np.full(len(gpu), -1, np.int64)
        found[launch >= 0] = _innermost(trace, launches, containers)[position]
        return found

    return Attribution(gpu, launch, around(ops), around(annotations), around(modules), reason)


def _by_arrow(trace: Trace, gpu: np.ndarray, runtime: np.ndarray) -> np.ndarray:
    """Per GPU row, the runtime call its launch arrow comes from, -1 for none."""
    sources, targets = trace.flow_rows()
    is_gpu = np.zeros(len(trace.slices), np.bool_)
    is_gpu[gpu] = True
    is_runtime = np.zeros(len(trace.slices), np.bool_)
    is_runtime[runtime] = True
    launched = is_gpu[targets] & is_runtime[sources]
    source_of = np.full(len(trace.slices), -1, np.int64)
    source_of[targets[launched]] = sources[launched]
    return source_of[gpu]


def _innermost(trace: Trace, targets: np.ndarray, containers: np.ndarray) -> np.ndarray:
    """Per target row, the innermost container row on its track whose span holds the target's,
    -1 for none. In nesting order (by track, start, longest first, containers before targets
    at one span, then row), every container on the target's track that comes before it starts
    no later, and holds it exactly when it ends no earlier; the innermost is the last of
    those. So the answer is the last container before the target in that order, on its track,
    ending at or after the target's end (_last_reaching): whether or not the containers nest."""
    table = trace.slices
    found = np.full(len(targets), -1, np.int64)
    if not len(targets) or not len(containers):
        return found
    rows = np.concatenate([containers, targets])
    order = by_track_in_nesting_order(table, rows)  # containers first at one span: they come first in `rows`
    placed = order >= len(containers)  # a target
    held = rows[order[~placed]]  # the containers in nesting order
    ahead = np.cumsum(~placed)[placed]  # per target (in nesting order), how many containers come before it
    which = order[placed] - len(containers)  # and its place in `targets`
    last = _last_reaching(table.spans(held)[1], ahead, table.spans(targets[which])[1])
    on_track = (last >= 0) & (table.track[held[np.maximum(last, 0)]] == table.track[targets[which]])
    found[which[on_track]] = held[last[on_track]]
    return found


def _last_reaching(values: np.ndarray, before: np.ndarray, least: np.ndarray) -> np.ndarray:
    """Per query i, the last position p < before[i] with values[p] >= least[i], -1 for none.
    The maxima of aligned blocks of 1, 2, 4, ... positions are kept (2n values in all); a
    query looks at the blocks that make up [0, before) from the right, the first whose
    maximum reaches `least`, then down that block, right half first: log n steps, each on
    columns of the queries still looking."""
    levels = [values]
    while len(levels[-1]) > 1:
        level = levels[-1]
        if len(level) % 2:
            level = levels[-1] = np.append(level, np.iinfo(np.int64).min)
        levels.append(np.maximum(level[0::2], level[1::2]))
    found = np.full(len(before), -1, np.int64)
    # Up: `right` is where the blocks not yet looked at end; a multiple of 2**depth at each depth.
    looking = np.flatnonzero(before > 0)
    right = before[looking]
    reached: list[tuple[np.ndarray, np.ndarray]] = []  # per depth, the queries whose block reaches, and the block
    for depth, level in enumerate(levels):
        has_block = (right >> depth) & 1 == 1
        block = (right[has_block] >> depth) - 1
        hit = level[block] >= least[looking[has_block]]
        reached.append((looking[has_block][hit], block[hit]))
        right[has_block] -= 1 << depth
        still = ~has_block
        still[np.flatnonzero(has_block)[~hit]] = True
        looking, right = looking[still], right[still]
    # Down: from the deepest blocks found, into the right half where it reaches, else the left.
    queries, blocks = reached[-1]
    for depth in range(len(levels) - 1, 0, -1):
        children = levels[depth - 1]
        right_half = 2 * blocks + 1
        blocks = np.where(children[right_half] >= least[queries], right_half, right_half - 1)
        queries = np.concatenate([queries, reached[depth - 1][0]])
        blocks = np.concatenate([blocks, reached[depth - 1][1]])
    found[queries] = blocks
    return found


def launch_args(trace: Trace) -> tuple[ExtraArgs, dict[str, object]]:
    """Each GPU slice's attribution (attribute) as args written beside its own under ATTRIBUTION,
    found on columns: each distinct (launch, op, annotation, module, reason, replay order) once. Returns them
    and what the summary says: GPU slices attributed, and the rest by reason."""
    found = attribute(trace)
    names, texts = trace.slices.name, trace.slices.texts
    keys = np.column_stack([np.where(column >= 0, names[np.maximum(column, 0)], -1)
                            for column in (found.launch, found.op, found.annotation, found.module)]
                           + [found.reason, _replay_order(trace, found)])
    distinct, which = distinct_rows(keys)
    values = [{**{field: texts[code] if field != REASON else _REASONS[code]
                  for field, code in zip(ATTRIBUTION_FIELDS, key) if code >= 0},
               **({REPLAY_ORDER: key[-1]} if key[-1] else {})} for key in distinct.tolist()]
    order = np.argsort(found.gpu, kind="stable")
    counts = np.bincount(found.reason + 1, minlength=len(_REASONS) + 1).tolist()
    return ExtraArgs(found.gpu[order], which[order], [{ATTRIBUTION: value} for value in values]), {
        "gpu_slices": len(found.gpu), "attributed": counts[0],
        "unattributed": {reason: count for reason, count in zip(_REASONS, counts[1:]) if count}}


def _replay_order(trace: Trace, found: Attribution) -> np.ndarray:
    """Per GPU slice launched by a cudaGraphLaunch, its place in that replay (1 for the first to
    start; by start, end, then row), else 0: the order the graph ran its work in."""
    table = trace.slices
    order = np.zeros(len(found.gpu), np.int64)
    graph_launch = np.fromiter((text == kineto.CUDA_GRAPH_LAUNCH for text in table.texts), np.bool_,
                               len(table.texts))
    replayed = np.flatnonzero((found.launch >= 0) & graph_launch[table.name[np.maximum(found.launch, 0)]])
    if not len(replayed):
        return order
    rows = found.gpu[replayed]
    ranked = replayed[np.lexsort((rows, table.end[rows], table.ts[rows], found.launch[replayed]))]
    launches = found.launch[ranked]
    first = np.flatnonzero(np.append(True, launches[1:] != launches[:-1]))
    starts = np.repeat(first, np.diff(np.append(first, len(ranked))))
    order[ranked] = np.arange(len(ranked)) - starts + 1
    return order
