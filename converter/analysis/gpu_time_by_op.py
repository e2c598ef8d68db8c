"""The report's GPU time by what launched it: per GPU, every GPU slice's time in the window
under the op, annotation and module around its launch, as compact wrote them on the slice
(engine/attribution.py; its fields in model/derived.py), and the slices whose launch is not in the trace by reason.

The attribution is read from the args, not found again here: compact found it on the trace
as read, before overlapping calls moved apart, and SQL over the written arrows could not.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Optional

from ..model.derived import ATTRIBUTION, ATTRIBUTION_FIELDS, UNATTRIBUTED_REASONS

GPU_TIME_BY_OP_DEFINITIONS = {
    "GPU time by op": "per GPU, the time in the window of every GPU slice (kernels, copies and sets) under what "
                      "launched it, as compact wrote on the slice (args cgtrace_launch.*): the op (the innermost cpu_op "
                      "around its launch, the CPU runtime call with its correlation id), the annotation (the "
                      "innermost user_annotation, not a ProfilerStep#N) and the module (the innermost nn.Module "
                      "python_function); slices launched outside every op are counted as no op, and those whose "
                      "launch is not in the trace as unattributed, by reason; every slice still counts in every "
                      "other figure",
    "unattributed": "a GPU slice whose launch is not in the trace, by why: "
                    + "; ".join(f"{reason}: {meaning}" for reason, meaning in UNATTRIBUTED_REASONS.items()),
}
# Where the trace holds no attribution (cgtrace did not compact it): what the report says instead.
NOT_ATTRIBUTED = f"could not tell: no GPU slice carries cgtrace's launch attribution (args {ATTRIBUTION}.*); " \
                 "compact the profiler's JSON and report that"
_SQL = """select w.owner, {fields}, count(*), sum(w.inside)
from report_gpu_in_window w join report_gpu g on g.id = w.id
group by 1, 2, 3, 4, 5, 6"""


def gpu_time_by_op(rows: Callable[[str], list[tuple[Any, ...]]], top: int) -> dict[int, dict[str, Any]]:
    """Per GPU (owner) with attribution, its GPU slices' time by op, annotation and module (the
    `top` of each by time, then name), no op, and unattributed by reason."""
    fields = ", ".join(f"extract_arg(g.arg_set_id, 'debug.{ATTRIBUTION}.{field}')" for field in ATTRIBUTION_FIELDS)
    found: dict[int, list[tuple[Optional[str], ...]]] = defaultdict(list)
    sums: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for owner, *values, slices, total in rows(_SQL.format(fields=fields)):
        found[owner].append(tuple(values))
        sums[owner].append((slices, total))
    return {owner: _figures(found[owner], sums[owner], top) for owner in found
            if any(value is not None for values in found[owner] for value in values)}


def _figures(keys: list[tuple[Optional[str], ...]], sums: list[tuple[int, int]], top: int) -> dict[str, Any]:
    """One GPU's figures from its (launch, op, annotation, module, reason) groups."""
    def ranked(position: int, label: str, limit: Optional[int] = max(top, 0)) -> list[dict[str, Any]]:
        totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for key, (slices, total) in zip(keys, sums):
            name = key[position]
            if name is not None:
                totals[name][0] += slices
                totals[name][1] += total
        best = sorted(totals.items(), key=lambda item: (-item[1][1], item[0]))[:limit]
        return [{label: name, "gpu_slices": slices, "total_ns": total} for name, (slices, total) in best]

    no_op = [(slices, total) for key, (slices, total) in zip(keys, sums) if key[0] is not None and key[1] is None]
    return {"ops": ranked(1, "op"), "annotations": ranked(2, "annotation"), "modules": ranked(3, "module"),
            "no_op": {"gpu_slices": sum(s for s, _ in no_op), "total_ns": sum(t for _, t in no_op)},
            "unattributed": ranked(4, "reason", None),  # every reason: the time no op can be told for
            "gpu_slices": sum(s for s, _ in sums), "total_ns": sum(t for _, t in sums)}
