"""Text for a terminal: what comes from a trace or a file name is shown, never acted on.

A control character (C0, DEL, C1) reaching a terminal acts: ESC starts a sequence that sets
the window title or the clipboard (OSC 52) or colours what follows, BEL rings, a newline
makes one line two. Names from traces, file names and paths the user typed reach stderr and
the text tables escaped; JSON and CSV keep them as they are, escaped by their own rules.
"""

from __future__ import annotations

_ESCAPES = str.maketrans({**{code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7f, 0xa0))},
                          **{"\n": "\\n", "\r": "\\r", "\t": "\\t"}})


def terminal_safe(text: str) -> str:
    """`text` with its control characters escaped."""
    return text.translate(_ESCAPES)
