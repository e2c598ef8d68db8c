"""`cgtrace query`: SQL over any trace through trace_processor, printed as a table, CSV or JSON."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Optional, Sequence

import orjson
from perfetto.trace_processor.api import TraceProcessor, TraceProcessorException

from ..errors import CgtraceError
from ..terminal import terminal_safe
from ..tp import open_trace
from ..tp.tables import check as check_tables

# trace_processor's SQL errors read "Traceback ...\n  File "stdin" line L col C\n    <sql line>\n    ^\n<message>".
_ERROR_PLACE = re.compile(r'line (\d+) col (\d+)\n(.*)\n( *)\^')
class Result:
    """Column names and rows (tuples of None, int, float, str or bytes) of one query."""

    def __init__(self, columns: list[str], rows: list[tuple]):
        self.columns = columns
        self.rows = rows


def open_checked(path: Path, tp_bin: Optional[str] = None, shown_as: Optional[Path] = None) -> TraceProcessor:
    """open_trace, with the one-line message users expect for a path that is not a file;
    messages name `shown_as` where `path` is a temporary trace made from it."""
    if not path.is_file():
        problem = "is a directory; pass a trace file" if path.is_dir() else "no such file; check the path"
        raise CgtraceError(f"{shown_as or path}: {problem} and try again")
    return open_trace(path, tp_bin=tp_bin, shown_as=shown_as)


def run_sql(tp: TraceProcessor, sql: str, trace: Path) -> Result:
    """Runs SQL (several statements give the last one's rows); SQL errors become CgtraceError."""
    try:
        result = tp.query(sql)
    except TraceProcessorException as error:
        check_tables(tp, str(trace))  # a view of cgtrace's that fails here is not the query's fault
        raise CgtraceError(f"{trace}: {sql_error(str(error))}; fix the query and run it again") from None
    width = len(result.column_names)
    cells = list(result.cells)
    rows = [tuple(cells[i:i + width]) for i in range(0, len(cells), width)] if width else []
    return Result(list(result.column_names), rows)


def sql_error(message: str) -> str:
    """trace_processor's multi-line SQL error as one line: where, near what, and its last line."""
    text = message.strip().splitlines()[-1] if message.strip() else "unknown error"
    place = _ERROR_PLACE.search(message)
    if not place:
        return f"SQL error: {text}"
    line, column, source, indent = place.groups()
    near = source[len(indent):].strip()[:40]
    return f"SQL error at line {line}, column {column}" + (f" (near `{near}`)" if near else "") + f": {text}"


def format_result(result: Result, fmt: str, width: Optional[int] = None) -> str:
    """`width`: the table's most characters a line (text cells are cut to fit); None keeps all."""
    if fmt == "csv":
        return format_csv(result)
    if fmt == "json":
        return format_json(result)
    return format_table(result.columns, result.rows, width=width)


def format_table(columns: Sequence[str], rows: Sequence[Sequence], numeric_columns: Sequence[int] = (),
                 width: Optional[int] = None) -> str:
    """Aligned text table; numbers (and cells of `numeric_columns`) are right-aligned. With
    `width`, the widest text columns are narrowed until a line fits, their cells cut with
    "…"; numbers are never cut (a cut number would read as another number)."""
    texts = [[terminal_safe(_cell_text(value, "NULL")) for value in row] for row in rows]
    columns = [terminal_safe(name) for name in columns]
    widths = [max([len(name)] + [len(row[i]) for row in texts]) for i, name in enumerate(columns)]
    numeric_heads = [i in numeric_columns or _all_numbers(row[i] for row in rows) for i in range(len(columns))]
    if width is not None:
        widths = _fit(widths, [i for i, numeric in enumerate(numeric_heads) if not numeric], width)
        columns = [_cut(name, w) for name, w in zip(columns, widths)]
        texts = [[_cut(text, w) for text, w in zip(row, widths)] for row in texts]
    lines = ["  ".join(name.rjust(w) if right else name.ljust(w)
                       for name, w, right in zip(columns, widths, numeric_heads)).rstrip(),
             "  ".join("-" * w for w in widths)]
    for row, values in zip(texts, rows):
        cells = [text.rjust(w) if _is_number(value) or i in numeric_columns else text.ljust(w)
                 for i, (text, value, w) in enumerate(zip(row, values, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


_NARROWEST = 8  # a text column is not cut below this (or its own width)


def _fit(widths: list[int], text_columns: list[int], limit: int) -> list[int]:
    """Column widths whose line (two spaces between columns) fits `limit`, taking one
    character at a time from the widest text column; as near as it gets where it cannot."""
    widths = list(widths)
    excess = sum(widths) + 2 * (len(widths) - 1) - limit
    while excess > 0:
        widest = max((i for i in text_columns if widths[i] > _NARROWEST), key=widths.__getitem__, default=None)
        if widest is None:
            break
        narrower = max(_NARROWEST, max((widths[i] for i in text_columns if widths[i] < widths[widest]), default=0))
        step = min(excess, widths[widest] - narrower) or 1
        widths[widest] -= step
        excess -= step
    return widths


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def format_csv(result: Result) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(result.columns)
    writer.writerows([_cell_text(value, "") for value in row] for row in result.rows)
    return out.getvalue()


def format_json(result: Result) -> str:
    """A list of row objects; a repeated column name gets a suffix so no value is lost."""
    keys: list[str] = []
    for name in result.columns:
        key, n = name, 1
        while key in keys:
            n += 1
            key = f"{name}_{n}"
        keys.append(key)
    objects = [{k: (v.hex() if isinstance(v, bytes) else v) for k, v in zip(keys, row)} for row in result.rows]
    return orjson.dumps(objects, option=orjson.OPT_INDENT_2).decode() + "\n"


def _all_numbers(values) -> bool:
    present = [value for value in values if value is not None]
    return bool(present) and all(map(_is_number, present))


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cell_text(value, null: str) -> str:
    if value is None:
        return null
    if isinstance(value, bytes):
        return "x'" + value.hex() + "'"
    if isinstance(value, float):
        return repr(value)
    return str(value)
