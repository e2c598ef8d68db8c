"""Lane rules: which GPU slices go to which lane group, in which order, under which label.

The built-in rules are TOML text, the same format `--lanes FILE` reads, so users change
grouping without editing code and `cgtrace lanes --print-default` prints a starting point.
A file's regexes are the user's, so they run on `regex`, which stops a match past a time
budget; the built-in ones are ours and never backtrack without end, so they run on the
standard library's `re`, and a command without `--lanes` does not load `regex`.
"""

from __future__ import annotations

import functools
import re
import sys
import time
from pathlib import Path
from typing import Callable, Mapping, Optional, Protocol, TypeVar

import msgspec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from . import kineto
from .errors import CgtraceError
from .fileio.regular import read_small_text
from .model import LaneGroup, LaneKind

LANES_FILE_LIMIT = 1 << 20
# The rules' regexes run on every distinct kernel name; a sane one takes microseconds, one that
# backtracks without end (`^(a+)+$`) would hang the run: `regex` stops it past this budget.
MATCH_SECONDS = 0.1
# Each match within its budget still adds up: 20 slow rules on 300 names ran past 150 s. All
# matching in one process stops past this total, naming the rule that took the most of it.
TOTAL_MATCH_SECONDS = 10.0
# `regex` unrolls counted repeats when it compiles: 83 bytes, (?:(?:a{1000}){1000}){1000}, would
# take 24 GB, and ~1,000 nested groups overflow its recursive parser. A pattern is refused first
# past these bounds (a kernel-name regex needs neither).
UNROLLED_LIMIT = 10_000
NESTING_LIMIT = 100
_COUNTED_REPEAT = re.compile(r"\{(\d*)(?:,(\d*))?\}")

DEFAULT_LANES_TOML = r'''# cgtrace lane rules. Pass a copy with --lanes FILE.
# GPU slices (categories below) are grouped by the first rule whose regexes match
# (Python `re` syntax, searched; `name` and/or `category`); unmatched slices go to `default_group`.
# Each group becomes lanes "<label>", "<label> 2", ... in the order of [[groups]].
# A group's `kind` (compute, communication, memory or other) is what `cgtrace report`
# counts it as: busy time, exposed communication. Without one, the default group is
# compute and any other group is other.

gpu_categories = ["kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"]
annotation_categories = ["gpu_user_annotation"]
default_group = "compute"
# Pipeline-parallel annotations (torch.distributed.pipelining): record_function("PP:" + action).
pp_pattern = '^PP:(?P<stage>\d+)(?P<action>SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD|REDUCE_GRAD|F|B|I|W)(?P<microbatch>\d*)$'

[[groups]]
id = "compute"
label = "Compute"
kind = "compute"

[[groups]]
id = "symm_mem"
label = "Symmetric memory"
kind = "communication"

[[groups]]
id = "nccl_all_gather"
label = "NCCL all-gather"
kind = "communication"

[[groups]]
id = "nccl_reduce_scatter"
label = "NCCL reduce-scatter"
kind = "communication"

[[groups]]
id = "nccl_all_reduce"
label = "NCCL all-reduce"
kind = "communication"

[[groups]]
id = "nccl_other"
label = "NCCL other"
kind = "communication"

[[groups]]
id = "memcpy"
label = "Memcpy"
kind = "memory"

[[groups]]
id = "memset"
label = "Memset"
kind = "memory"

[[rules]]
category = '(?i)^(gpu_)?memcpy$'
group = "memcpy"

[[rules]]
category = '(?i)^(gpu_)?memset$'
group = "memset"

# Symmetric-memory collectives (torch.distributed._symmetric_memory; NVLS `multimem_*`
# kernels, as in `multimem_all_reduce_kernel`) move data between GPUs: communication.
[[rules]]
name = '(?i)symmetric_memory|symm_mem|symmmem|multimem'
group = "symm_mem"

[[rules]]
name = '(?i)nccl.*(all_?gather)'
group = "nccl_all_gather"

[[rules]]
name = '(?i)nccl.*(reduce_?scatter)'
group = "nccl_reduce_scatter"

[[rules]]
name = '(?i)nccl.*(all_?reduce)'
group = "nccl_all_reduce"

[[rules]]
name = '(?i)nccl'
group = "nccl_other"
'''


T = TypeVar("T")


class Match(Protocol):
    """What a rule's regex found (`regex`'s match, or `re`'s); for a PP annotation, the named
    groups stage, action and microbatch always take part (_parse checks pp_pattern names them)."""

    @property
    def string(self) -> str: ...

    def group(self, name: str, /) -> str: ...


class Pattern(Protocol):
    """A rule's compiled regex, searched or matched within `timeout` seconds: a `regex`
    pattern, or a built-in rule's (_BuiltInPattern), which needs no budget."""

    @property
    def groupindex(self) -> Mapping[str, int]: ...

    def search(self, string: str, *, timeout: float) -> Optional[Match]: ...

    def match(self, string: str, *, timeout: float) -> Optional[Match]: ...


class _BuiltInPattern:
    """A built-in rule's regex, on `re`: it ends fast on any name, so the budget goes unused."""

    def __init__(self, pattern: str):
        self._pattern = re.compile(pattern)

    @property
    def groupindex(self) -> Mapping[str, int]:
        return self._pattern.groupindex

    def search(self, string: str, *, timeout: float) -> Optional[re.Match[str]]:
        return self._pattern.search(string)

    def match(self, string: str, *, timeout: float) -> Optional[re.Match[str]]:
        return self._pattern.match(string)


class Rule(msgspec.Struct, frozen=True):
    """One [[rules]] entry: a GPU slice joins `group` where every regex given matches."""

    group: str
    name: Optional[Pattern]
    category: Optional[Pattern]
    where: str  # "rule 3 (group 'nccl_other')", for messages

    def matches(self, name: str, category: str, timeout: float) -> bool:
        return (self.name is None or self.name.search(name, timeout=timeout) is not None) and \
            (self.category is None or self.category.search(category, timeout=timeout) is not None)


class LaneRules:
    """Parsed rules from `source`; `group_of` and `pp_match` are cached per name, since names
    repeat (and a cached name costs a dict look-up, not a timed match)."""

    def __init__(self, source: str, groups: list[LaneGroup], rules: list[Rule], default_group: str,
                 gpu_categories: frozenset, annotation_categories: frozenset, pp_pattern: Pattern):
        self.source = source
        self.groups = groups
        self.rules = rules
        self.default_group = default_group
        self.gpu_categories = gpu_categories
        self.annotation_categories = annotation_categories
        self.pp_pattern = pp_pattern
        self.group_order = {group.id: index for index, group in enumerate(groups)}
        self._cache: dict[tuple[str, str], str] = {}
        self._pp_cache: dict[str, Optional[Match]] = {}
        self._spent: dict[str, float] = {}  # seconds matching, per rule (its `where`) and pp_pattern

    def __getstate__(self) -> dict:
        """Rules travel to worker processes and Dask workers as they are; their caches (which
        hold unpicklable matches) and their time spent start afresh there."""
        return {**self.__dict__, "_cache": {}, "_pp_cache": {}, "_spent": {}}

    def group_of(self, name: str, category: str) -> str:
        key = (name, category)
        group = self._cache.get(key)
        if group is None:
            group = next((rule.group for rule in self.rules
                          if self._timed(rule.where, name, lambda timeout: rule.matches(name, category, timeout))),
                         self.default_group)
            self._cache[key] = group
        return group

    def pp_match(self, name: str) -> Optional[Match]:
        """`pp_pattern` matched at the start of `name`, or None."""
        if name not in self._pp_cache:
            match = self._timed("pp_pattern", name, lambda timeout: self.pp_pattern.match(name, timeout=timeout))
            if match is not None:
                self._check_numbers(match)
            self._pp_cache[name] = match
        return self._pp_cache[name]

    def _check_numbers(self, match: Match) -> None:
        """The stage (and the microbatch, where there is one) are read as numbers: a pattern whose
        groups take other text is the file's mistake, not the trace's."""
        stage, microbatch = match.group("stage"), match.group("microbatch")
        for group, text in (("stage", stage), ("microbatch", microbatch or "0")):
            if not isinstance(text, str) or not text.isdecimal():
                raise CgtraceError(f"{self.source}: pp_pattern's {group} group took {text!r:.40} from "
                                   f"{match.string[:60]!r}, which is no number; make it match digits "
                                   f"only, like (?P<{group}>\\d+)")

    def _timed(self, what: str, name: str, match: Callable[[float], T]) -> T:
        """match(timeout) within both budgets, its time counted to `what`; CgtraceError past either."""
        timeout = min(MATCH_SECONDS, TOTAL_MATCH_SECONDS - sum(self._spent.values()))
        started = time.perf_counter()
        try:
            if timeout > 0:
                return match(timeout)
        except TimeoutError:
            pass
        finally:
            self._spent[what] = self._spent.get(what, 0.0) + time.perf_counter() - started
        raise self._too_slow(what, name, over_total=timeout < MATCH_SECONDS)

    def _too_slow(self, what: str, name: str, over_total: bool) -> CgtraceError:
        simplify = "simplify its regex (a repeat inside a repeat, like (a+)+, can backtrack without end)"
        if over_total:
            slowest = max(self._spent, key=self._spent.__getitem__)
            return CgtraceError(f"{self.source}: matching kernel names took over {TOTAL_MATCH_SECONDS:g} s in all, "
                                f"{self._spent[slowest]:.1f} s of it in {slowest}; {simplify}")
        return CgtraceError(f"{self.source}: {what} took over {MATCH_SECONDS} s to match {name[:60]!r}; {simplify}")

    def group(self, group_id: str) -> LaneGroup:
        return self.groups[self.group_order[group_id]]

    def label(self, group_id: str) -> str:
        return self.group(group_id).label


def load_lane_rules(path: Optional[Path] = None) -> LaneRules:
    """The built-in rules, or those in a TOML file; a bad file raises CgtraceError. Read once
    per command: jobs carry the parsed rules (JobOptions.lanes); the built-in ones once per process."""
    if path is None:
        return _built_in()
    source = str(path)
    text = read_small_text(path, LANES_FILE_LIMIT, "a lane rules TOML file (--lanes)")
    try:
        data = tomllib.loads(text)
        return _parse(source, data, _compile)
    except (tomllib.TOMLDecodeError, KeyError, TypeError, ValueError, RecursionError) as error:
        detail = "arrays or tables nested too deep to read" if isinstance(error, RecursionError) else \
            f"missing key {error}" if isinstance(error, KeyError) else error
        raise CgtraceError(f"{source}: invalid lane rules ({detail}); fix it, starting from "
                           "`cgtrace lanes --print-default`") from None


@functools.cache
def _built_in() -> LaneRules:
    return _parse("built-in lane rules", tomllib.loads(DEFAULT_LANES_TOML),
                  lambda pattern, where: _BuiltInPattern(str(pattern)))


def _parse(source: str, data: dict, compile_pattern: Callable[[object, str], Pattern]) -> LaneRules:
    """The rules of a TOML document, each regex compiled by compile_pattern(pattern, where)."""
    default_group = data.get("default_group", data["groups"][0]["id"] if data["groups"] else None)
    groups = [LaneGroup(id=str(g["id"]), label=str(g["label"]), kind=_kind(g, default_group)) for g in data["groups"]]
    ids = {group.id for group in groups}
    if len(ids) != len(groups) or not groups:
        raise ValueError("[[groups]] must list at least one group, each id once")
    rules = []
    for number, rule in enumerate(data.get("rules", []), start=1):
        if rule["group"] not in ids:
            raise ValueError(f"rule names unknown group {rule['group']!r}")
        if "name" not in rule and "category" not in rule:
            raise ValueError("each rule needs `name` and/or `category`")
        where = f"rule {number} (group {rule['group']!r})"
        rules.append(Rule(group=rule["group"], where=where,
                          name=compile_pattern(rule["name"], f"{where} name") if "name" in rule else None,
                          category=compile_pattern(rule["category"], f"{where} category") if "category" in rule
                          else None))
    if default_group not in ids:
        raise ValueError(f"default_group {default_group!r} is not a group")
    pp_pattern = compile_pattern(data.get("pp_pattern", r"^PP:(?P<stage>\d+)(?P<action>[A-Z_]+)(?P<microbatch>\d*)$"),
                          "pp_pattern")
    if not {"stage", "action", "microbatch"} <= set(pp_pattern.groupindex):
        raise ValueError("pp_pattern needs the named groups stage, action and microbatch")
    return LaneRules(source, groups, rules, default_group,
                     frozenset(data.get("gpu_categories", kineto.GPU_CATEGORIES)),
                     frozenset(data.get("annotation_categories", kineto.GPU_ANNOTATION_CATEGORIES)),
                     pp_pattern)


def _compile(pattern: object, where: str) -> Pattern:
    """A user's `pattern` compiled by `regex`, once its size unrolled and its nesting are known
    to be bounded; ValueError naming `where` otherwise."""
    import regex  # only for a rules file (the module docstring says why)

    if not isinstance(pattern, str):
        raise ValueError(f"{where}: a regex must be a string")
    unrolled, depth = _unrolled_size(pattern)
    if depth > NESTING_LIMIT:
        raise ValueError(f"{where}: groups nest over {NESTING_LIMIT} deep; simplify the regex")
    if unrolled > UNROLLED_LIMIT:
        raise ValueError(f"{where}: counted repeats unroll to over {UNROLLED_LIMIT:,} items, like "
                         "(?:a{1000}){1000}; make the counts smaller, or use + and *")
    try:
        return regex.compile(pattern)
    except regex.error as error:
        raise ValueError(f"{where}: {error}") from None


def _unrolled_size(pattern: str) -> tuple[int, int]:
    """An upper bound on how many items `pattern` unrolls to (each counted repeat multiplies
    what it repeats by its largest count), and how deep its groups nest. Read lexically, so
    it errs large: `regex` itself would recurse past Python's limit on the nesting."""
    levels = [[0, 0]]  # per open group: [its size so far, the size of its last item]
    depth, at = 1, 0
    while at < len(pattern):
        char, item = pattern[at], 1
        repeat = _COUNTED_REPEAT.match(pattern, at) if char == "{" else None
        if char == "\\":
            at += 1
        elif char == "[":
            at = _class_end(pattern, at)
        elif char == "(":
            levels.append([0, 0])
            depth = max(depth, len(levels))
            at += 1
            continue
        elif char == ")" and len(levels) > 1:
            item = max(levels.pop()[0], 1)
        elif repeat is not None and (repeat.group(1) or repeat.group(2)):
            count = max(int(text) if len(text) < 9 else UNROLLED_LIMIT + 1 for text in repeat.groups("") if text)
            level = levels[-1]
            level[0] = min(level[0] + level[1] * (count - 1), UNROLLED_LIMIT + 1)
            level[1] = min(level[1] * count, UNROLLED_LIMIT + 1)
            at = repeat.end()
            continue
        levels[-1][0] += item
        levels[-1][1] = item
        at += 1
    return sum(level[0] for level in levels), depth


def _class_end(pattern: str, at: int) -> int:
    """Where the character class opening at `at` ends (its `]`; a `]` first in it is a member)."""
    at += 2 if pattern.startswith("[^", at) else 1
    at += pattern.startswith("]", at)
    while at < len(pattern) and pattern[at] != "]":
        at += 2 if pattern[at] == "\\" else 1
    return at


def _kind(group: dict, default_group: object) -> LaneKind:
    kind = group.get("kind")
    if kind is None:
        return LaneKind.COMPUTE if group["id"] == default_group else LaneKind.OTHER
    try:
        return LaneKind(kind)
    except ValueError:
        raise ValueError(f"group {group['id']!r}: kind {kind!r} is not one of "
                         f"{', '.join(k.value for k in LaneKind)}") from None
