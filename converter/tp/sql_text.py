"""Values written into SQL text: the views' definitions and the analyses' queries quote them
one way, so a name with a quote in it reads the same everywhere."""

from __future__ import annotations

from typing import Iterable, Optional


def sql_literal(value: Optional[str | int]) -> str:
    """A value as SQL text: a string quoted (its quotes doubled), None as null, else an integer."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(int(value))


def sql_list(values: Iterable[Optional[str | int]]) -> str:
    """Values as the inside of an SQL `in (...)` list."""
    return ", ".join(map(sql_literal, values))
