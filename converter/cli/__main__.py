"""`python -m converter.cli`: the `cgtrace` command."""

from . import console

console()
