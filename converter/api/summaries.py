"""What the Python API hands back: the command line's JSON summary as a typed, frozen object,
its main figures as fields and the whole summary beside them, so a notebook gets attribute
access and completion without losing anything the JSON holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple

from ..errors import CgtraceError

if TYPE_CHECKING:
    from ..analysis.report import Report


class GpuLanes(NamedTuple):
    """One GPU of a compacted trace: how many streams became how many lanes."""

    gpu: str
    streams: int
    lanes: int


class GpuFigures(NamedTuple):
    """One GPU's headline figures from a report (times in ns, shares of its window 0..1)."""

    gpu: str
    window_ns: int
    busy_ns: int
    busy_share: float
    exposed_comm_ns: int
    exposed_comm_share: float


@dataclass(frozen=True)
class Kernel:
    """A kernel of the report's top list: how often it ran and for how long in all."""

    name: str
    count: int
    total_ns: int
    mean_ns: float


def written_files(summary: Mapping[str, Any]) -> tuple[Path, ...]:
    """Every file written: the output, each step's file (split by step), or each pipeline's."""
    parts = summary.get("steps") or summary.get("pipelines") or [summary]
    return tuple(Path(part["output"]) for part in parts)


@dataclass(frozen=True)
class ConvertSummary:
    """What `convert` (and `compact`) wrote; `summary` is the command line's JSON summary."""

    input: Path
    outputs: tuple[Path, ...]
    slices: int
    flows: int
    tracks: int
    events_skipped: int
    summary: Mapping[str, object] = field(repr=False)

    @property
    def output(self) -> Path:
        """The written trace (the first step's, when split by step)."""
        return self.outputs[0]

    @classmethod
    def of(cls, summary: Mapping[str, Any]) -> ConvertSummary:
        return cls(Path(summary["input"]), written_files(summary), summary["slices"], summary["flows"],
                   summary["tracks"], summary["events_skipped"], summary)


@dataclass(frozen=True)
class CompactSummary(ConvertSummary):
    """What `compact` wrote, with each GPU's streams and lanes."""

    gpus: tuple[GpuLanes, ...] = ()

    @classmethod
    def of(cls, summary: Mapping[str, Any]) -> CompactSummary:
        base = ConvertSummary.of(summary)
        lanes = tuple(GpuLanes(gpu["gpu"], gpu["streams"], gpu["lanes"]) for gpu in summary["per_gpu"])
        return cls(base.input, base.outputs, base.slices, base.flows, base.tracks, base.events_skipped,
                   summary, lanes)


@dataclass(frozen=True)
class MergeSummary:
    """What `merge` wrote: a file per pipeline, its global ranks in pipeline order, the arrows
    drawn between ranks."""

    outputs: tuple[Path, ...]
    ranks: tuple[tuple[int, ...], ...]
    send_recv_pairs: int
    send_recv_unmatched: int
    summary: Mapping[str, object] = field(repr=False)

    @property
    def output(self) -> Path:
        """The merged trace (the first pipeline's, where there are several)."""
        return self.outputs[0]

    @classmethod
    def of(cls, summary: Mapping[str, Any]) -> MergeSummary:
        pipelines = summary.get("pipelines") or [summary]
        return cls(written_files(summary), tuple(
            tuple(r["global_rank"] for r in sorted(p["pp_ranks"], key=lambda r: r["pp_rank"])) for p in pipelines),
                   sum(p["pp_send_recv_pairs"] for p in pipelines),
                   sum(p["pp_send_recv_unmatched"] for p in pipelines), summary)


@dataclass(frozen=True)
class ReportSummary:
    """`cgtrace report` as an object: headline figures per GPU, the top kernels, every figure
    in `figures` (the JSON report), and the text and HTML renderings. In a notebook it shows
    as the HTML report."""

    trace: str
    gpus: tuple[GpuFigures, ...]
    top_kernels: tuple[Kernel, ...]
    figures: Mapping[str, object] = field(repr=False)
    report: Report = field(repr=False, compare=False)

    def text(self) -> str:
        """The tables `cgtrace report` prints."""
        from ..analysis.render import render

        return render(self.report, "text")

    def html(self) -> str:
        """One self-contained page, as `cgtrace report --format html` writes it."""
        from ..analysis.render import render

        return render(self.report, "html")

    def _repr_html_(self) -> str:
        return self.html()

    @classmethod
    def of(cls, report: Report) -> ReportSummary:
        figures = report.figures
        gpus = tuple(GpuFigures(g["gpu"], g["window_ns"], g["busy_ns"], g["busy_share"], g["exposed_comm_ns"],
                                g["exposed_comm_share"]) for g in figures["gpus"])
        kernels = tuple(Kernel(k["name"], k["count"], k["total_ns"], k["mean_ns"]) for k in figures["top_kernels"])
        return cls(figures["input"]["trace"], gpus, kernels, figures, report)


class Finding(NamedTuple):
    """One line of a report's or diff's findings, under the key CI can gate on."""

    key: str
    text: str


class Change(NamedTuple):
    """One figure on both sides of a diff, in ns per step: what it is, A's, B's, B - A."""

    subject: str
    a_ns: int
    b_ns: int
    delta_ns: int


@dataclass(frozen=True)
class DiffSummary:
    """`cgtrace diff` as an object: the findings, each lane group's, kernel's and launching op's
    change, every figure in `figures` (the JSON diff), and the text and HTML renderings."""

    a: str
    b: str
    findings: tuple[Finding, ...]
    lane_groups: tuple[Change, ...]
    kernels: tuple[Change, ...]
    kernels_by_op: tuple[Change, ...]
    figures: Mapping[str, object] = field(repr=False)

    def beyond(self, pct: float) -> tuple[str, ...]:
        """The figures `--fail-above pct` gates on that moved more than `pct` percent, a line each."""
        from ..analysis.diff import beyond
        from ..jobs.options import is_percentage

        if not is_percentage(pct):
            raise CgtraceError(f"beyond({pct!r}): expected a percentage, 0 or more (0: any change fails)")
        return tuple(beyond(dict(self.figures), pct))

    def text(self) -> str:
        """The findings and tables `cgtrace diff` prints."""
        from ..analysis.diff_render import render_diff

        return render_diff(dict(self.figures), "text")

    def html(self) -> str:
        """One self-contained page, as `cgtrace diff --format html` writes it."""
        from ..analysis.diff_render import render_diff

        return render_diff(dict(self.figures), "html")

    def _repr_html_(self) -> str:
        return self.html()

    @classmethod
    def of(cls, diff: Mapping[str, Any]) -> DiffSummary:
        def change(subject: str, row: Mapping[str, Any]) -> Change:
            return Change(subject, row["a_ns"], row["b_ns"], row["delta_ns"])
        return cls(diff["a"]["trace"], diff["b"]["trace"],
                   tuple(Finding(found["key"], found["text"]) for found in diff["findings"]),
                   tuple(change(f"{row['gpu']}: {row['group']}", row) for row in diff["lane_groups"]),
                   tuple(change(row["name"], row) for row in diff["kernels"]),
                   tuple(change(f"{row['gpu']}: {row['op']}", row) for row in diff["kernels_by_op"]), diff)
