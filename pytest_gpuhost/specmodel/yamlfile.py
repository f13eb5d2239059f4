"""The spec's file as YAML nodes: its bytes (``specfile.py`` reads them, bounded) composed,
refused where a spec must not go, and walked through ``Node``, whose typed accessors raise
SpecError at the node's line.

The YAML half of the spec layer (``__init__.py`` holds the model the nodes become). Every
problem is a SpecError, never a traceback: bytes that are not UTF-8, YAML nested deeper than
MAX_DEPTH, an explicit tag other than the core schema's (``!!binary``,
``!!timestamp``, ``!!python/...``, ``!custom``), and merge keys (``<<``). Merge keys are refused
rather than supported: which of the merged and the written keys wins, and the line a merged value
came from, are easy to get wrong silently in a file that decides what a root tool writes;
writing the keys out is explicit, and the error says so. A value its tag cannot construct
(``!!int "abc"``, an integer of more digits than Python converts) is refused when a Node reads it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

import yaml
from yaml.constructor import SafeConstructor

from .specfile import MAX_DEPTH, SpecError, closest, excerpt

FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser where PyYAML has it: composes a 300-entry spec about 10x faster. A spec it
refuses is composed again by the pure-Python parser, whose messages name the bad character."""
CORE = "tag:yaml.org,2002:"
"""The prefix of the core schema's tags (``tag:yaml.org,2002:str``)."""
_ALLOWED_TAGS = {
    yaml.ScalarNode: {f"{CORE}{name}" for name in ("str", "int", "bool", "null", "float")},
    yaml.SequenceNode: {f"{CORE}seq"},
    yaml.MappingNode: {f"{CORE}map"},
}


def tag_name(tag: str) -> str:
    """``tag:yaml.org,2002:binary`` -> ``!!binary``."""
    return "!!" + tag[len(CORE):] if tag.startswith(CORE) else tag


def _decoded(data: bytes, shown: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(shown, f"cannot read the spec: not UTF-8 ({exc})") from None


def _refuse_deep(text: str, shown: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH from the parser's events (no recursion), before
    the pure-Python composer would recurse into it."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                line = f":{event.start_mark.line + 1}" if event.start_mark else ""
                raise SpecError(f"{shown}{line}",
                                f"the YAML is nested deeper than {MAX_DEPTH} levels; a spec "
                                "is a few levels deep")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _compose(text: str, shown: str) -> yaml.Node | None:
    if FAST_LOADER is not yaml.SafeLoader:
        try:  # libyaml refuses nesting past its own limit rather than recursing
            node: yaml.Node | None = yaml.compose(text, Loader=FAST_LOADER)
            return node
        except yaml.YAMLError:
            pass  # composed again below, for the pure-Python parser's message
    _refuse_deep(text, shown)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError:
        raise SpecError(shown, "the YAML is nested too deeply") from None
    return node


_MERGE = f"{CORE}merge"


def _where(shown: str, node: yaml.Node) -> str:
    return f"{shown}:{node.start_mark.line + 1}"


_SCALAR_TAGS = _ALLOWED_TAGS[yaml.ScalarNode]
_MAP = f"{CORE}map"
_SEQ = f"{CORE}seq"


def _plainly_allowed(root: yaml.Node) -> bool:
    """Whether ``_check_nodes`` has nothing to refuse, in one cheaper pass over a tree: True
    when no node is deeper than MAX_DEPTH and every tag is the core schema's (a merge key's is
    not). False is no verdict: a node it does not expect, a problem, or a collection an alias
    shares (whether its deeper place is refused depends on the order ``_check_nodes`` meets
    it in): ``_check_nodes`` then decides, and names the problem, as it always did. A shared
    scalar is judged at every place, a superset of those ``_check_nodes`` judges it at."""
    if type(root) is yaml.ScalarNode:
        return root.tag in _SCALAR_TAGS
    stack: list[tuple[yaml.Node, int]] = [(root, 1)]
    seen: set[int] = set()
    while stack:
        node, depth = stack.pop()
        if id(node) in seen:
            return False
        seen.add(id(node))
        kind = type(node)
        if kind is yaml.MappingNode:
            if node.tag != _MAP:
                return False
            children = [child for pair in node.value for child in pair]
        elif kind is yaml.SequenceNode:
            if node.tag != _SEQ:
                return False
            children = node.value
        else:
            return False
        if children and depth >= MAX_DEPTH:
            return False
        for child in children:
            kind = type(child)
            if kind is yaml.ScalarNode:
                if child.tag not in _SCALAR_TAGS:
                    return False
            elif kind is yaml.MappingNode or kind is yaml.SequenceNode:
                stack.append((child, depth + 1))
            else:
                return False
    return True


def _check_nodes(root: yaml.Node, shown: str) -> None:
    """Every node, without recursion (and each shared by an alias once): no deeper than
    MAX_DEPTH, no merge key, no tag outside the core schema."""
    if _plainly_allowed(root):
        return
    stack: list[tuple[yaml.Node, int]] = [(root, 1)]
    seen: set[int] = set()
    while stack:
        node, depth = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if depth > MAX_DEPTH:
            raise SpecError(_where(shown, node), f"the YAML is nested deeper than {MAX_DEPTH} "
                                                 "levels; a spec is a few levels deep")
        if node.tag == _MERGE:
            raise SpecError(_where(shown, node), "merge keys ('<<') are not supported in a "
                                                 "spec: write the keys out in each mapping "
                                                 "(which of a merged and a written key wins is "
                                                 "easy to get wrong)")
        if node.tag not in _ALLOWED_TAGS[type(node)]:
            raise SpecError(_where(shown, node), f"a {tag_name(node.tag)} value is not "
                                                 "supported in a spec; write plain strings, "
                                                 "integers, booleans, lists and mappings (quote "
                                                 "a value to keep it a string)")
        if isinstance(node, yaml.MappingNode):
            stack.extend((child, depth + 1) for pair in node.value for child in pair)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in node.value)


def compose_spec(data: bytes, shown: str) -> yaml.Node | None:
    """The root node of a spec file's bytes (None for an empty file), every node checked; any
    problem is a SpecError naming ``shown`` and, where it has one, the line."""
    text = _decoded(data, shown)
    try:
        root = _compose(text, shown)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise SpecError(f"{shown}{line}", f"not valid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise SpecError(shown, f"not valid YAML: {exc}") from None
    if root is not None:
        _check_nodes(root, shown)
    return root


_STR = f"{CORE}str"
_INT = f"{CORE}int"
_COLLECTIONS = (yaml.MappingNode, yaml.SequenceNode)


class Node:
    """A YAML node that remembers where it came from, with typed accessors that raise SpecError.

    The nodes of one spec share one YAML constructor, which remembers every value it made:
    it goes, with the nodes, once the spec is parsed (a constructor kept for the session kept
    every node of every spec alive, and the garbage collector walked them all at each full
    collection)."""

    __slots__ = ("_constructor", "_node", "file", "key_line")

    def __init__(self, node: yaml.Node, file: str, key_line: int | None = None,
                 constructor: SafeConstructor | None = None) -> None:
        self._node = node
        self.file = file
        self.key_line = key_line
        """For a mapping value: the line of its key, where errors about the key point."""
        self._constructor = constructor if constructor is not None else SafeConstructor()

    @property
    def line(self) -> int:
        return int(self._node.start_mark.line) + 1

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def error(self, message: str) -> SpecError:
        return SpecError(self.where, message)

    def key_error(self, message: str) -> SpecError:
        """An error about the key this value sits under (unknown key, bad name)."""
        return SpecError(f"{self.file}:{self.key_line or self.line}", message)

    def unknown_key(self, key: str, what: str, allowed: Iterable[str]) -> SpecError:
        """The one message for a key a section or an entry does not know: where, a "did you
        mean" and every key it takes (every kind says it the same way)."""
        choices = list(allowed)
        return self.key_error(f"unknown key {excerpt(key)} in {what}{closest(key, choices)}; "
                              f"expected one of: {', '.join(choices)}")

    @property
    def is_mapping(self) -> bool:
        return isinstance(self._node, yaml.MappingNode)

    @property
    def is_sequence(self) -> bool:
        return isinstance(self._node, yaml.SequenceNode)

    def mapping(self, what: str) -> list[tuple[str, Node]]:
        """The (key, value) pairs of a mapping, in file order; duplicate keys are errors."""
        if not self.is_mapping:
            raise self.error(f"{what} must be a mapping, got {self.kind_name()}")
        pairs: list[tuple[str, Node]] = []
        seen: dict[str, int] = {}
        file, constructor = self.file, self._constructor
        for key_node, value_node in self._node.value:
            if type(key_node) is yaml.ScalarNode and key_node.tag == _STR and \
                    key_node.value.isascii():  # what scalar() would say, without a Node
                name = key_node.value
                line = int(key_node.start_mark.line) + 1
            else:
                key = Node(key_node, file, constructor=constructor)
                name = key.scalar()
                if not isinstance(name, str):
                    raise key.error(f"keys in {what} must be strings, got {excerpt(name)}")
                line = key.line
            if name in seen:
                raise Node(key_node, file, constructor=constructor).error(
                    f"duplicate key {excerpt(name)} in {what} (first at line {seen[name]})")
            seen[name] = line
            pairs.append((name, Node(value_node, file, line, constructor)))
        return pairs

    def sequence(self, what: str) -> list[Node]:
        if not self.is_sequence:
            raise self.error(f"{what} must be a list, got {self.kind_name()}")
        return [Node(child, self.file, constructor=self._constructor)
                for child in self._node.value]

    def scalar(self) -> Any:
        if not isinstance(self._node, yaml.ScalarNode):
            raise self.error(f"expected a single value, got {self.kind_name()}")
        return self._construct()

    def _construct(self) -> Any:
        """The scalar's value; one its tag cannot construct is a SpecError at its line."""
        node = self._node
        tag = node.tag
        if tag == _STR:  # what the constructor would return, without its bookkeeping
            value: Any = node.value
        else:
            try:
                text = node.value
                if tag == _INT and type(text) is str and text.isascii() and text.isdigit() \
                        and (text[0] != "0" or text == "0"):
                    value = int(text)  # construct_yaml_int's own answer for plain decimals
                else:
                    value = self._constructor.construct_object(node)
            except Exception as exc:  # ValueError, KeyError, ConstructorError: all the spec's
                problem = getattr(exc, "problem", None) or str(exc) or type(exc).__name__
                problem = problem.split(": '", 1)[0]  # int()'s message quotes the whole value
                raise self.error(f"cannot read the value {excerpt(str(node.value))} as "
                                 f"{tag_name(tag)}: {problem}") from None
        if type(value) is float and not math.isfinite(value):
            raise self.error(f"the value {excerpt(str(node.value))} is "
                             f"{'not a number' if value != value else 'an infinity'}: every "
                             "number of a spec is a finite number (NaN passes every comparison, "
                             "an infinity bounds nothing)")
        if isinstance(value, str) and not value.isascii() and not _encodable(value):
            raise self.error(f"the value {excerpt(value)} holds a lone surrogate (an escape like "
                             "\\ud800), which is no character")
        return value

    def kind_name(self) -> str:
        if self.is_mapping:
            return "a mapping"
        if self.is_sequence:
            return "a list"
        value = self._construct()
        return "nothing" if value is None else f"{type(value).__name__} {excerpt(value)}"

    def text(self, what: str) -> str:
        """A string, or an integer taken as its decimal string; booleans and floats are refused."""
        value = None if isinstance(self._node, _COLLECTIONS) else self.scalar()
        if isinstance(value, bool) or value is None or isinstance(value, float):
            raise self.error(f"{what} must be a string or an integer, got {self.kind_name()}")
        if isinstance(value, int):
            return str(value)
        if isinstance(value, str):
            return value
        raise self.error(f"{what} must be a string or an integer, got {self.kind_name()}")

    def string(self, what: str) -> str:
        value = None if isinstance(self._node, _COLLECTIONS) else self.scalar()
        if not isinstance(value, str) or not value:
            raise self.error(f"{what} must be a non-empty string, got {self.kind_name()}")
        return value

    def boolean(self, what: str) -> bool:
        value = None if isinstance(self._node, _COLLECTIONS) else self.scalar()
        if not isinstance(value, bool):
            raise self.error(f"{what} must be true or false, got {self.kind_name()}")
        return value

    def regex(self, what: str) -> re.Pattern[str]:
        pattern = self.string(what)
        try:
            return re.compile(pattern)
        except re.error as exc:
            raise self.error(f"{what} is not a valid regular expression: {exc}") from None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
