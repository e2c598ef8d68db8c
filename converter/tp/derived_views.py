"""`slice` holds measured work only: the views that keep cgtrace's derived rows apart.

A sum over `slice` in a trace cgtrace wrote would otherwise count its own answers (a merge's
critical path copies the names and times of the work it passes through; arrival markers
and kernel label spans add rows) as if they were work. So in every trace processor cgtrace
opens, a trace that holds cgtrace's track roles gets:

- `slice`: the measured slices only (trace_processor's own view, filtered);
- `cgtrace_derived_slice`: the rows cgtrace derived, with `derived_as` saying which kind;
- `cgtrace_all_slice`: both, as trace_processor reads the file.

In other traces `slice` stays as trace_processor reads it, and the two cgtrace views exist too. The statements (`definitions`) work in
any trace processor that defines `slice` as a view, the Perfetto UI's query page included.
"""

from __future__ import annotations

import re
from typing import Any

from ..model import derived, roles_document

_CATEGORIES = ", ".join(f"'{category}'" for category in derived.CATEGORIES)
_KINDS = " ".join(f"when '{category}' then '{kind}'" for category, kind in derived.CATEGORIES.items())
# trace_processor defines `slice` as a view over its intrinsic table; its body is reused, so
# the filtered view keeps every column (cat, slice_id, ...) that version gives.
_VIEW_BODY = re.compile(r"^\s*create\s+view\s+slice\s+as\s+(?P<body>.+)$", re.IGNORECASE | re.DOTALL)
_DEFINITION_SQL = "select sql from sqlite_master where type = 'view' and name = 'slice'"
_MARKED_SQL = f"select count(*) as n from ({roles_document.SQL})"


def definitions(slice_body: str) -> list[str]:
    """The statements that split `slice` (whose defining select is `slice_body`) into measured
    and derived rows."""
    return [
        f"create view cgtrace_all_slice as {slice_body}",
        "drop view slice",
        f"create view slice as select * from cgtrace_all_slice where coalesce(category, '') not in ({_CATEGORIES})",
        f"create view cgtrace_derived_slice as select *, case category {_KINDS} end as derived_as "
        f"from cgtrace_all_slice where category in ({_CATEGORIES})",
    ]


# Any other trace: nothing is derived, and the views exist all the same, so one query reads any trace.
_NOTHING_DERIVED = ["create view cgtrace_all_slice as select * from slice",
                    "create view cgtrace_derived_slice as select *, null as derived_as from slice where 0"]


def keep_derived_apart(tp: Any) -> None:
    """Applies the split to an open trace processor where the trace is cgtrace's and this
    trace_processor defines `slice` as a view (every version cgtrace can run does)."""
    found = [row.sql for row in tp.query(_DEFINITION_SQL)] if next(iter(tp.query(_MARKED_SQL))).n else []
    match = _VIEW_BODY.match(found[0]) if found else None
    for statement in definitions(match.group("body")) if match is not None else _NOTHING_DERIVED:
        tp.query(statement)
