"""The spec layer: a YAML file becomes a frozen, validated model, or a SpecError naming file:line.

No pytest here and no host access. Each section of the spec is parsed by the check kind that owns
it (see ``checks``); this module supplies the entry options every entry may carry (why, fix,
when, severity), the expectation forms (exact, min/max, one_of, match) and ``load_spec``.

Every problem with a spec is a SpecError naming file:line, never a traceback. The YAML side is
``yamlfile.py``: the file read and refused (its size and type, the YAML's depth, tags and merge
keys) and ``Node``, a YAML node with typed accessors that raise SpecError.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import msgspec

from .envelope import Limits, parse_limits
from .matchers import Domain, Exact, Expectation, Match, OneOf, Range
from .specfile import MAX_DEPTH as MAX_DEPTH  # re-exported
from .specfile import MAX_SPEC_BYTES as MAX_SPEC_BYTES  # re-exported
from .specfile import SpecError as SpecError  # re-exported
from .specfile import closest, excerpt, read_spec, shown_name

if TYPE_CHECKING:
    from .yamlfile import Node as Node  # re-exported, at first use (below)

SPEC_VERSION = 1
ENVELOPE = "envelope"
"""The section that holds a benchmark envelope's limits (``envelope.py``), not a check kind's."""


def __getattr__(name: str) -> object:
    """``Node`` and ``FAST_LOADER`` are the YAML side's (``yamlfile.py``), imported where a
    spec is parsed: a spec the cache holds (``cache.py``) is loaded without PyYAML."""
    if name in ("Node", "FAST_LOADER"):
        from . import yamlfile

        return getattr(yamlfile, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Condition(msgspec.Struct, frozen=True):
    """``when: infiniband`` or ``when: not container``."""

    name: str
    negate: bool = False

    def __str__(self) -> str:
        return f"not {self.name}" if self.negate else self.name


class EntryOptions(msgspec.Struct, frozen=True):
    """What every spec entry may carry beside its expected value."""

    where: str
    why: str | None = None
    fix: bool = True
    when: Condition | None = None
    severity: str = "normal"
    """Allure's severity of a failure: blocker, critical, normal, minor or trivial."""


OPTION_KEYS = ("why", "fix", "when", "severity")
SEVERITIES = ("blocker", "critical", "normal", "minor", "trivial")


class SpecContext(msgspec.Struct, frozen=True):
    """What a section parser may consult: the known ``when:`` conditions, and the spec's name
    (boot-time kinds name the drop-ins they write after it)."""

    conditions: frozenset[str]
    spec_name: str = ""
    sections: Mapping[str, Node] = msgspec.field(default_factory=dict)
    """Every section of the spec by name, for a kind whose words depend on another's keys
    (p2p names the pcie keys that fix what slows a pair); a kind parses only its own."""
    folder: str = ""
    """The spec file's folder, absolute: where a path the spec gives of this machine is
    relative to (nccl's ``from:``)."""

    def parse_options(self, node: Node, pairs: Iterable[tuple[str, Node]]) -> EntryOptions:
        """Entry options from the option keys among ``pairs`` (other keys are the caller's)."""
        why: str | None = None
        fix = True
        when: Condition | None = None
        severity = "normal"
        for key, value in pairs:
            if key == "why":
                why = value.string("why")
            elif key == "fix":
                fix = value.boolean("fix")
            elif key == "when":
                when = self.parse_condition(value)
            elif key == "severity":
                severity = value.string("severity")
                if severity not in SEVERITIES:
                    raise value.error(f"unknown severity {severity!r}"
                                      f"{closest(severity, SEVERITIES)}; expected one of: "
                                      f"{', '.join(SEVERITIES)}")
        return EntryOptions(where=node.where, why=why, fix=fix, when=when, severity=severity)

    def parse_condition(self, node: Node) -> Condition:
        text = node.string("when").strip()
        negate = text.startswith("not ")
        name = text[4:].strip() if negate else text
        if name not in self.conditions:
            known = ", ".join(sorted(self.conditions))
            raise node.error(f"unknown condition {name!r} for when{closest(name, self.conditions)}"
                             f"; known conditions: {known}")
        return Condition(name, negate)


class Section(msgspec.Struct, frozen=True):
    """A section's (or an entry's) mapping once its keys are known: the values by key, in file
    order, and the entry options every section and entry may carry."""

    values: Mapping[str, Node]
    options: EntryOptions

    def get(self, key: str) -> Node | None:
        return self.values.get(key)


def section(node: Node, what: str, keys: Sequence[str], context: SpecContext, *,
            empty: bool = False) -> Section:
    """The one schema check of every section: a mapping whose keys are ``keys`` or the entry
    options (why, fix, when, severity); an unknown key is refused at its line with a "did you
    mean" and the full list. ``empty``: a bare ``section:`` (no value) means all defaults."""
    if empty and not (node.is_mapping or node.is_sequence) and node.scalar() is None:
        return Section({}, EntryOptions(where=node.where))
    pairs = node.mapping(what)
    allowed = (*keys, *OPTION_KEYS)
    for key, value in pairs:
        if key not in allowed:
            raise value.unknown_key(key, what, allowed)
    values = {key: value for key, value in pairs if key not in OPTION_KEYS}
    return Section(values, context.parse_options(node, pairs))


MATCHER_KEYS = ("min", "max", "one_of", "match")


def parse_expectation(
    node: Node,
    context: SpecContext,
    domain: Domain,
    *,
    what: str,
    value_key: str = "value",
    matchers: tuple[str, ...] = MATCHER_KEYS,
    others: tuple[str, ...] = (),
) -> tuple[Expectation, EntryOptions]:
    """An entry's expectation and options.

    A scalar is an exact value. A mapping holds either ``value_key`` (exact), ``min`` and/or
    ``max``, ``one_of`` or ``match``, next to the entry options. ``others``: keys the caller
    handles before it gets here, named in the unknown-key message all the same.
    """
    if not node.is_mapping:
        return _exact(node, domain, what), EntryOptions(where=node.where)
    allowed = (value_key, *matchers, *OPTION_KEYS)
    pairs = node.mapping(what)
    for key, value in pairs:
        if key not in allowed:
            raise value.unknown_key(key, what, (value_key, *others, *matchers, *OPTION_KEYS))
    given = {key: value for key, value in pairs if key not in OPTION_KEYS}
    forms = [k for k in given if k not in ("min", "max")] + (
        ["min/max"] if "min" in given or "max" in given else [])
    if len(forms) != 1:
        ranged = ["min/max"] if "min" in matchers or "max" in matchers else []
        exact = [m for m in matchers if m not in ("min", "max")]
        expected = ", ".join([value_key, *ranged, *exact])
        got = "none" if not forms else " and ".join(forms)
        raise node.error(f"{what} needs exactly one of {expected}; got {got}")
    options = context.parse_options(node, pairs)
    if value_key in given:
        return _exact(given[value_key], domain, what), options
    if "one_of" in given:
        items = given["one_of"].sequence(f"{what}: one_of")
        if not items:
            raise given["one_of"].error(f"{what}: one_of needs at least one value")
        values = tuple(_value(item, domain, what) for item in items)
        return OneOf(values, domain), options
    if "match" in given:
        return Match(given["match"].regex(f"{what}: match")), options
    low = _value(given["min"], domain, what) if "min" in given else None
    high = _value(given["max"], domain, what) if "max" in given else None
    for bound, key in ((low, "min"), (high, "max")):
        if bound is not None:
            try:
                domain.order_key(bound)
            except ValueError as exc:
                raise given[key].error(f"{what}: min/max need a value with an order: "
                                       f"{exc}") from None
    if low is not None and high is not None and domain.order_key(low) > domain.order_key(high):
        raise node.error(f"{what}: min {low} is greater than max {high}")
    return Range(low, high, domain), options


def _value(node: Node, domain: Domain, what: str) -> str:
    text = node.text(what)
    try:
        domain.validate(text)
    except ValueError as exc:
        raise node.error(f"{what}: {exc}") from None
    return text


def _exact(node: Node, domain: Domain, what: str) -> Exact:
    return Exact(_value(node, domain, what), domain)


class SectionParser(Protocol):
    """The spec side of a check kind: validates its top-level section into a frozen model."""

    section: str

    def parse(self, node: Node, context: SpecContext) -> object: ...


class Spec(msgspec.Struct, frozen=True):
    path: Path
    name: str
    version: int
    sections: Mapping[str, object]
    """Section name -> the model its parser returned, in the parsers' registration order."""
    digest: str = ""
    """sha256 of the bytes this model was parsed from: the spec that ran, whatever the file
    holds later (an edit during the run is the next run's spec)."""
    envelope: Limits | None = None
    """The ``envelope:`` section's limits (``envelope.py``): no check of the host, but how a
    benchmark's window on it is judged; None where the spec has no such section."""


def load_spec(
    path: Path,
    parsers: Mapping[str, SectionParser],
    conditions: Iterable[str],
    *,
    display: Callable[[Path], str] = str,
) -> Spec:
    """Read and validate a spec file; raise SpecError with ``file:line`` on any problem."""
    shown = shown_name(path, display)
    return parse_spec(read_spec(path, shown), path, shown, parsers, conditions)


def parse_spec(
    data: bytes,
    path: Path,
    shown: str,
    parsers: Mapping[str, SectionParser],
    conditions: Iterable[str],
) -> Spec:
    """Validate the bytes of the spec file ``path`` (named ``shown`` in messages)."""
    from .yamlfile import Node, compose_spec

    root = compose_spec(data, shown)
    if root is None:
        raise SpecError(f"{shown}:1", f"the spec is empty; expected 'version: {SPEC_VERSION}' "
                                      f"and at least one of: {', '.join(parsers)}")
    top = Node(root, shown)
    pairs = dict(top.mapping("the spec"))
    if "version" not in pairs:
        raise top.error(f"the spec needs 'version: {SPEC_VERSION}' at the top")
    version_node = pairs.pop("version")
    if version_node.scalar() != SPEC_VERSION or isinstance(version_node.scalar(), bool):
        raise version_node.error(f"unsupported spec version {excerpt(version_node.scalar())}; "
                                 f"this pytest-gpuhost reads version {SPEC_VERSION}")
    name = path.stem
    if "name" not in pairs and not name.isprintable():
        raise top.error(f"the spec's file name {path.name!r} holds a control character, and the "
                        "name of a spec goes into the journal's and --fix-persist's file names "
                        "and headers: rename the file, or give the spec a 'name:'")
    if "name" in pairs:
        name_node = pairs.pop("name")
        name = name_node.string("name")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise name_node.error(f"name {excerpt(name)} must be letters, digits, '.', '_' or '-'")
    envelope = None
    if ENVELOPE in pairs:
        envelope = parse_limits(pairs.pop(ENVELOPE))
    context = SpecContext(frozenset(conditions), name, pairs, str(path.absolute().parent))
    for key, node in pairs.items():
        if key not in parsers:
            known = ", ".join(parsers)
            raise node.key_error(f"unknown section {excerpt(key)}{closest(key, parsers)}; "
                                 f"known sections: {known}, {ENVELOPE}")
    if not pairs and envelope is None:
        raise top.error(f"the spec has no checks; add at least one of: {', '.join(parsers)}")
    sections = {
        section: parser.parse(pairs[section], context)
        for section, parser in parsers.items()
        if section in pairs
    }
    return Spec(path=path, name=name, version=SPEC_VERSION, sections=sections,
                digest=hashlib.sha256(data).hexdigest(), envelope=envelope)
