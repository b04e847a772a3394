"""Compile a JSON schema with Flow `reduce` annotations into a fast reducer.

    reducer = reducer_for_schema({"type": "object", "reduce": {"strategy": "merge"},
                                  "properties": {"n": {"reduce": {"strategy": "sum"}}}})
    reducer({"n": 1}, {"n": 2})  -> {"n": 3}

Where annotations apply (Flow applies the annotations of every subschema that validates a location):
  - a schema's own `reduce`, and those reached through `$ref` ("#", "#/pointer", "#anchor", $id URIs) and
    `allOf`, apply unconditionally. When a schema has its own `reduce` and its `$ref` target has another, the
    schema's own wins (Flow's min/max-with-key example relies on it); two different strategies otherwise at
    one location are an error ("conflicting strategies at this location").
  - `oneOf` / `anyOf` branches and `if` / `then` / `else` apply when the right-hand value validates against
    them (see validate.py): decided per value, and the combination compiled once and cached.
  - children: `properties`, `patternProperties`, `additionalProperties` (for names neither of the others
    matches), `items` / `prefixItems` / `additionalItems` (either draft's spelling).
  - an un-annotated location is lastWriteWins.
Each location compiles once into a closure (engine.py, sets.py); un-annotated children cost no call at all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from headrace.errors import FeatureNotSupported, InvalidParameterValue
from headrace.materialize.reduce import engine, sets
from headrace.materialize.reduce.engine import UNSET, Fn
from headrace.materialize.reduce.validate import SchemaIndex, is_valid, item_schemas
from headrace.materialize.reduce.values import DELETE, MISSING, Pointer, ReductionError, parse_pointer

Document = dict[str, Any]

_OPTIONS: dict[str, frozenset[str]] = {
    "append": frozenset(),
    "firstWriteWins": frozenset(),
    "lastWriteWins": frozenset({"delete", "associative"}),
    "maximize": frozenset({"key"}),
    "minimize": frozenset({"key"}),
    "merge": frozenset({"key", "delete"}),
    "set": frozenset({"key"}),
    "sum": frozenset(),
}
_PATTERN_CACHE_LIMIT = 4096  # property names cached per location when patternProperties decide their child


@dataclass(frozen=True, slots=True)
class Strategy:
    """One parsed `reduce` annotation."""

    name: str
    key: tuple[Pointer, ...] = ()
    delete: bool = False
    associative: bool = True

    @property
    def is_plain_last_write_wins(self) -> bool:
        return self.name == "lastWriteWins" and not self.delete and self.associative

    def describe(self) -> str:
        options = [f"key={['/' + '/'.join(p) if p else '' for p in self.key]}"] if self.key else []
        options += ["delete"] if self.delete else []
        options += ["associative=false"] if not self.associative else []
        return self.name + (f"({', '.join(options)})" if options else "")


def parse_strategy(annotation: Any) -> Strategy:
    """A `reduce` annotation ({"strategy": ..., options}) as Flow accepts it: unknown options are errors."""
    if not isinstance(annotation, dict) or not isinstance(annotation.get("strategy"), str):
        raise InvalidParameterValue(f"invalid reduce annotation {annotation!r}: expected {{\"strategy\": ...}}")
    name = annotation["strategy"]
    if name == "jsonSchemaMerge":
        raise FeatureNotSupported("reduction strategy 'jsonSchemaMerge' is not supported",
                                  hint="it needs Flow's schema inference; use merge or lastWriteWins")
    if name not in _OPTIONS:
        raise FeatureNotSupported(f"reduction strategy {name!r} is not supported",
                                  hint=f"supported strategies: {', '.join(sorted(_OPTIONS))}")
    unknown = set(annotation) - {"strategy"} - _OPTIONS[name]
    if unknown:
        raise InvalidParameterValue(f"reduce annotation of {name!r} has unknown field(s): {', '.join(sorted(unknown))}")
    key = annotation.get("key", [])
    if not isinstance(key, list) or not all(isinstance(p, str) for p in key):
        raise InvalidParameterValue(f"reduce annotation of {name!r}: key must be a list of JSON pointers")
    try:
        pointers = tuple(parse_pointer(p) for p in key)
    except ValueError as error:
        raise InvalidParameterValue(f"reduce annotation of {name!r}: {error}") from None
    delete, associative = annotation.get("delete", False), annotation.get("associative", True)
    if not isinstance(delete, bool) or not isinstance(associative, bool):
        raise InvalidParameterValue(f"reduce annotation of {name!r}: delete and associative must be booleans")
    return Strategy(name, pointers, delete, associative)


class _Conflict(Exception):
    pass


def _choose(entries: list[tuple[Strategy, bool]]) -> Strategy | None:
    """The strategy of a location from (strategy, reached through $ref) entries; raises _Conflict."""
    for via_ref in (False, True):
        found = {s for s, v in entries if v == via_ref}
        if len(found) > 1:
            first, second = sorted(found, key=Strategy.describe)[:2]
            raise _Conflict(f"conflicting strategies at this location: {first.describe()} vs {second.describe()}")
        if found:
            return found.pop()
    return None


class Node:
    """One location of a compiled schema: its reduce function `fn` and its children's, built on demand."""

    def __init__(self, compiler: Compiler, pieces: tuple[dict[str, Any], ...],
                 conds: tuple[tuple[str, dict[str, Any]], ...], entries: list[tuple[Strategy, bool]]) -> None:
        self._compiler = compiler
        self.pieces = pieces
        self.conds = conds
        self._entries = entries
        self._dynamic: dict[tuple[int, ...], Node] = {}
        self._plain_merge: Fn | None = None
        self.prop_fns: dict[str, Fn | None] = {}
        self._prop_nodes: dict[str, Node] = {}
        self._named = frozenset(name for p in pieces for name in p.get("properties", {}))
        self._has_patterns = any(p.get("patternProperties") for p in pieces)
        self.default_fn: Any = UNSET  # child function of names outside `properties`; UNSET: patterns decide
        self.prefix_fns: list[Fn | None] = []
        self.rest_fn: Fn | None = None
        self.conflict: str | None = None
        try:
            self.strategy = _choose(entries)
        except _Conflict as conflict:
            self.strategy, self.conflict = None, str(conflict)
        self.fn: Fn | None = self._build_fn()

    # ------------------------------------------------------------------------------------------ reduce fn

    def _build_fn(self) -> Fn | None:
        if self.conflict is not None:
            message = self.conflict

            def conflicting(lhs: Any, rhs: Any, full: bool) -> Any:
                raise ReductionError(message, lhs, rhs)
            return conflicting
        if self.conds:
            return self._dispatch
        s = self.strategy
        if s is None or s.is_plain_last_write_wins:
            return None
        name = s.name
        if name == "lastWriteWins":
            return engine.last_write_wins_fn(s.delete, s.associative)
        if name == "firstWriteWins":
            return engine.first_write_wins
        if name == "append":
            return engine.append
        if name == "sum":
            return engine.sum_
        if name in ("minimize", "maximize"):
            if s.key:
                return engine.min_max_by_key_fn(self, s.key, reverse=name == "maximize")
            return engine.minimize if name == "minimize" else engine.maximize
        if name == "merge":
            return engine.merge_fn(self, s.key, s.delete)
        if name == "set":
            return sets.set_fn(self, s.key)
        raise AssertionError(name)

    def _dispatch(self, lhs: Any, rhs: Any, full: bool) -> Any:
        """Conditional location: pick the branches `rhs` validates against, reduce by their combination."""
        index = self._compiler.index
        chosen: list[Any] = []
        for kind, schema in self.conds:
            if kind == "if":
                if is_valid(schema["if"], rhs, index):
                    chosen.append(schema["if"])
                    if "then" in schema:
                        chosen.append(schema["then"])
                elif "else" in schema:
                    chosen.append(schema["else"])
            else:
                chosen.extend(b for b in schema[kind] if is_valid(b, rhs, index))
        signature = tuple(id(b) for b in chosen)
        target = self._dynamic.get(signature)
        if target is None:
            target = self._compiler.specialize(self, chosen)
            self._dynamic[signature] = target
        fn = target.fn
        return rhs if fn is None else fn(lhs, rhs, full)

    def plain_merge(self, lhs: Any, rhs: Any, full: bool) -> Any:
        """merge without key or delete: how minimize/maximize combine sides with equal keys."""
        if self._plain_merge is None:
            self._plain_merge = engine.merge_fn(self, (), False)
        return self._plain_merge(lhs, rhs, full)

    # ------------------------------------------------------------------------------------------ children

    def child_node(self, name: str) -> Node:
        node = self._prop_nodes.get(name)
        if node is not None:
            return node
        schemas: list[Any] = []
        for piece in self.pieces:
            matched = False
            properties = piece.get("properties", {})
            if name in properties:
                schemas.append(properties[name])
                matched = True
            for pattern, sub in piece.get("patternProperties", {}).items():
                if re.search(pattern, name):
                    schemas.append(sub)
                    matched = True
            if not matched and "additionalProperties" in piece:
                schemas.append(piece["additionalProperties"])
        node = self._compiler.node_for(schemas)
        if name in self._named or len(self._prop_nodes) < _PATTERN_CACHE_LIMIT:
            self._prop_nodes[name] = node
        return node

    def child_fn(self, name: str) -> Fn | None:
        fn = self.prop_fns.get(name, self.default_fn)
        return self.pattern_child_fn(name) if fn is UNSET else fn

    def pattern_child_fn(self, name: str) -> Fn | None:
        """Child function of a name outside `properties` when patternProperties decide (cached, bounded)."""
        fn = self.child_node(name).fn
        if len(self.prop_fns) < _PATTERN_CACHE_LIMIT:
            self.prop_fns[name] = fn
        return fn

    def item_fn(self, index: int) -> Fn | None:
        return self.prefix_fns[index] if index < len(self.prefix_fns) else self.rest_fn

    def link_children(self) -> None:
        """Compile named properties, additionalProperties and items now (once): hot paths then only read dicts."""
        for name in sorted(self._named):
            self.prop_fns[name] = self.child_node(name).fn
        if not self._has_patterns:
            self.default_fn = self._compiler.node_for([p["additionalProperties"] for p in self.pieces
                                                       if "additionalProperties" in p]).fn
        splits = [item_schemas(p) for p in self.pieces]
        longest = max((len(prefix) for prefix, _ in splits), default=0)
        for i in range(longest):
            node = self._compiler.node_for([prefix[i] if i < len(prefix) else rest
                                            for prefix, rest in splits if i < len(prefix) or rest is not None])
            self.prefix_fns.append(node.fn)
        self.rest_fn = self._compiler.node_for([rest for _, rest in splits if rest is not None]).fn


class Compiler:
    """Compiles the locations of one schema document, each distinct combination of subschemas once."""

    def __init__(self, schema: Any) -> None:
        self.index = SchemaIndex(schema)
        self._nodes: dict[tuple[Any, ...], Node] = {}
        self.conflicts: list[str] = []  # of locations compiled ahead of any document (not conditional ones)

    def _flatten(self, schemas: list[Any]) -> tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]],
                                                    list[tuple[Strategy, bool]]]:
        pieces: list[dict[str, Any]] = []
        conds: list[tuple[str, dict[str, Any]]] = []
        entries: list[tuple[Strategy, bool]] = []
        seen: set[int] = set()

        def visit(schema: Any, via_ref: bool) -> None:
            if not isinstance(schema, dict) or id(schema) in seen:
                return
            seen.add(id(schema))
            pieces.append(schema)
            if "reduce" in schema:
                entries.append((parse_strategy(schema["reduce"]), via_ref))
            if isinstance(schema.get("$ref"), str):
                visit(self.index.resolve(schema["$ref"]), True)
            for member in schema.get("allOf", ()):
                visit(member, via_ref)
            for kind in ("oneOf", "anyOf", "if"):
                if kind in schema:
                    conds.append((kind, schema))

        for schema in schemas:
            visit(schema, False)
        return pieces, conds, entries

    def node_for(self, schemas: list[Any]) -> Node:
        pieces, conds, entries = self._flatten(schemas)
        return self._node(pieces, conds, entries)

    def specialize(self, base: Node, branches: list[Any]) -> Node:
        """The location `base` once its conditionals chose `branches` (which may hold conditionals of their own)."""
        pieces, conds, entries = self._flatten(branches)
        merged = list(base.pieces) + [p for p in pieces if all(p is not q for q in base.pieces)]
        return self._node(merged, conds, list(base._entries) + entries)

    def _node(self, pieces: list[dict[str, Any]], conds: list[tuple[str, dict[str, Any]]],
              entries: list[tuple[Strategy, bool]]) -> Node:
        signature = (tuple(id(p) for p in pieces), tuple((kind, id(s)) for kind, s in conds))
        node = self._nodes.get(signature)
        if node is None:
            node = Node(self, tuple(pieces), tuple(conds), entries)
            self._nodes[signature] = node  # before linking: recursive schemas find it here
            if node.conflict is not None:
                self.conflicts.append(node.conflict)
            if not conds:
                node.link_children()
        return node


class SchemaReducer:
    """A Reducer compiled from a schema: `reducer(older, newer)` is Flow's associative (partial) reduction.

    `full(older, newer)` is the reduction into a base document (the one loaded from the store, or None when the
    key is new): deletions take effect (None means the whole document is deleted), set "remove"/"intersect"
    terms are dropped, and merges may change a location's type.
    """

    def __init__(self, schema: Any) -> None:
        self.schema = schema
        compiler = Compiler(schema)
        self._root = compiler.node_for([schema])
        if compiler.conflicts:
            raise InvalidParameterValue(f"invalid reduce annotations: {compiler.conflicts[0]}")

    def __call__(self, older: Document | None, newer: Document) -> Document:
        fn = self._root.fn
        if fn is None:
            return newer
        return fn(MISSING if older is None else older, newer, False)  # type: ignore[no-any-return]

    def full(self, older: Document | None, newer: Document) -> Document | None:
        fn = self._root.fn
        if fn is None:
            return newer
        result = fn(MISSING if older is None else older, newer, True)
        return None if result is DELETE else result  # type: ignore[no-any-return]

    def reduce(self, lhs: Any, rhs: Any, *, full: bool = False) -> Any:
        """Reduce any JSON values (None is JSON null here; pass values.MISSING for "no left-hand side").
        A full reduction may return values.DELETE."""
        fn = self._root.fn
        return rhs if fn is None else fn(lhs, rhs, full)

    @property
    def strategy(self) -> Strategy | None:
        """The root location's own strategy (None: lastWriteWins by default, or decided by conditionals)."""
        return self._root.strategy


def reducer_for_schema(schema: dict[str, Any] | bool) -> SchemaReducer:
    """Compile `schema` (a JSON schema with Flow `reduce` annotations) once; the result is a Reducer."""
    return SchemaReducer(schema)
