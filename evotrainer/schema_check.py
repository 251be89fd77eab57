"""A JSON Schema subset compiled to Python source: a fast *accept* path in front of the ``jsonschema`` package.

MCP clients validate every structured tool result against the tool's output schema; the SDK client does it
with ``jsonschema`` (one ``Validator`` per tool, built once), which walks the schema keyword by keyword and
descends into a new validator object per property and item: ~0.1 ms for ``get_version``'s 1.8 kB result,
~0.4 ms for ``list_analyzers``' 2.7 kB, more than the rest of an in-process call (docs/performance.md §4).

:func:`compile_check` turns a schema into one predicate ``check(instance) -> bool`` for the keywords our output
schemas use (``type``, ``properties``, ``required``, ``additionalProperties``, ``items``, ``anyOf``, ``allOf``,
``enum``, ``const``, numeric and length bounds; annotations such as ``title`` and ``description`` are
skipped). It is *sound*, not complete: ``check(x)`` True means ``jsonschema`` (Draft 2020-12, the SDK's
default dialect, ``format`` not asserted) accepts ``x``; False means "not sure", and the caller asks
``jsonschema`` (:class:`FastAcceptValidator`), so accept / reject and every error message stay
``jsonschema``'s. Where the two dialects' rules are subtle the check answers False: an integral float
(``1.0``) for ``integer``, ``enum`` / ``const`` values other than same-typed scalars, any number type other
than ``int`` / ``float``. A schema with any other keyword (``$ref``, ``pattern``, ``oneOf``, ...) or a
``$schema`` other than 2020-12 is not compiled (None): ``jsonschema`` validates it as before.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator
from typing import Any

from evotrainer.errors import EvoTrainerError

Check = Callable[[Any], bool]

ANNOTATIONS = frozenset({"title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly",
                         "$comment", "format", "$id", "$anchor", "contentMediaType", "contentEncoding"})
"""Keywords that never reject an instance (``format`` is an annotation unless a format checker is given)."""

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"

_TYPE_CONDITIONS: dict[str, str] = {
    "object": "isinstance({v}, dict)",
    "array": "isinstance({v}, list)",
    "string": "isinstance({v}, str)",
    "boolean": "isinstance({v}, bool)",
    "null": "{v} is None",
    # int / float only; bool is not a number in JSON Schema; an integral float is "not sure" (False)
    "integer": "(isinstance({v}, int) and not isinstance({v}, bool))",
    "number": "(isinstance({v}, (int, float)) and not isinstance({v}, bool))",
}
_SIZES = {"minLength": ("str", ">="), "maxLength": ("str", "<="), "minItems": ("list", ">="),
          "maxItems": ("list", "<="), "minProperties": ("dict", ">="), "maxProperties": ("dict", "<=")}


class NotCompiled(EvoTrainerError):
    """The schema uses a keyword outside the compiled subset (internal: the caller falls back to jsonschema)."""


def compile_check(schema: Any, format_asserted: bool = False) -> Check | None:
    """A sound predicate for ``schema`` (see the module docstring), or None when it uses other keywords.

    ``format_asserted``: the validator it stands in front of checks ``format`` (a ``jsonschema`` validator
    with a ``format_checker``); then a schema with ``format`` is not compiled.

    The predicate is generated Python source (one function, a block per keyword, a loop per array or extra
    property), compiled once: ~5 us for ``get_version``'s result, where ``jsonschema`` takes ~100 us.
    """
    if isinstance(schema, dict) and schema.get("$schema", DRAFT_2020_12) != DRAFT_2020_12:
        return None
    gen = _Generator(format_asserted)
    try:
        body = gen.schema(schema, "x", 1, root=True)
        source = "def check(x):\n" + "".join(body) + "    return True\n"
        namespace: dict[str, Any] = dict(gen.constants)
        exec(compile(source, "<schema check>", "exec"), namespace)  # noqa: S102 (source generated above)
    except (NotCompiled, SyntaxError, RecursionError, MemoryError):  # SyntaxError: > 20 nested loops
        return None
    check: Check = namespace["check"]
    return check


def _number_in_bound(x: Any, op: str, limit: float) -> bool:
    """A numeric bound. It applies to numbers only (as in JSON Schema: not to bool, str, ...); a number other
    than int / float (``Decimal``, which ``jsonschema`` compares too) and NaN are "not sure" (False)."""
    if isinstance(x, bool) or not isinstance(x, numbers.Number):
        return True
    if not isinstance(x, (int, float)) or (isinstance(x, float) and math.isnan(x)):
        return False
    return {"minimum": x >= limit, "maximum": x <= limit, "exclusiveMinimum": x > limit,
            "exclusiveMaximum": x < limit}[op]


def _in_options(x: Any, pairs: tuple[tuple[type, Any], ...]) -> bool:
    """``enum`` / ``const``: a scalar of the same type and value (``jsonschema`` then finds it equal too)."""
    return any(type(x) is t and x == o for t, o in pairs)


class _Generator:
    """Source lines of a check: each block returns False where the instance may be invalid."""

    def __init__(self, format_asserted: bool = False) -> None:
        self.skip = ANNOTATIONS - {"format"} if format_asserted else ANNOTATIONS
        self.constants: dict[str, Any] = {"_number_in_bound": _number_in_bound, "_in_options": _in_options,
                                          "_MISSING": object()}
        self.n = 0

    def name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def const(self, value: Any) -> str:
        name = self.name("_c")
        self.constants[name] = value
        return name

    def type_condition(self, schema: Any, v: str) -> str | None:
        """The condition of a schema that is only a ``type`` (plus annotations), else None."""
        if not isinstance(schema, dict) or any(k not in self.skip and k != "type" for k in schema):
            return None
        names = schema.get("type")
        names = [names] if isinstance(names, str) else names
        if not isinstance(names, list) or not names or any(n not in _TYPE_CONDITIONS for n in names):
            return None
        return " or ".join(_TYPE_CONDITIONS[n].format(v=v) for n in names)

    def function(self, schema: Any) -> str:
        """A separate ``def`` for an ``anyOf`` branch; returns its name."""
        fname = self.name("_f")
        body = self.schema(schema, "y", 1)
        source = f"def {fname}(y):\n" + "".join(body) + "    return True\n"
        exec(compile(source, "<schema check>", "exec"), self.constants)  # noqa: S102 (source generated here)
        return fname

    def schema(self, schema: Any, v: str, depth: int, root: bool = False  # noqa: C901 (a branch per keyword)
               ) -> list[str]:
        pad = "    " * depth
        if schema is True:
            return []
        if schema is False or not isinstance(schema, dict):
            raise NotCompiled(repr(schema))
        out: list[str] = []
        for key, value in schema.items():
            if key in self.skip or (key == "$schema" and root):
                continue
            if key == "type":
                cond = self.type_condition({"type": value}, v)
                if cond is None:
                    raise NotCompiled(f"type {value!r}")
                out.append(f"{pad}if not ({cond}): return False\n")
            elif key == "properties":
                if not isinstance(value, dict):
                    raise NotCompiled("properties")
                inner: list[str] = []
                for prop, sub in value.items():
                    w = self.name("v")
                    code = self.schema(sub, w, depth + 2)
                    if code:
                        inner.append(f"{pad}    {w} = {v}.get({prop!r}, _MISSING)\n")
                        inner.append(f"{pad}    if {w} is not _MISSING:\n")
                        inner.extend(code)
                if inner:
                    out.append(f"{pad}if isinstance({v}, dict):\n")
                    out.extend(inner)
            elif key == "required":
                if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
                    raise NotCompiled("required")
                if value:
                    cond = " and ".join(f"{n!r} in {v}" for n in value)
                    out.append(f"{pad}if isinstance({v}, dict) and not ({cond}): return False\n")
            elif key == "additionalProperties":
                if "patternProperties" in schema or not isinstance(schema.get("properties", {}), dict):
                    raise NotCompiled("patternProperties")
                known = self.const(frozenset(schema.get("properties", {})))
                if value is False:
                    out.append(f"{pad}if isinstance({v}, dict) and not {known}.issuperset({v}): return False\n")
                else:
                    k, w = self.name("k"), self.name("v")
                    code = self.schema(value, w, depth + 3)
                    if code:
                        out.append(f"{pad}if isinstance({v}, dict):\n{pad}    for {k}, {w} in {v}.items():\n"
                                   f"{pad}        if {k} not in {known}:\n")
                        out.extend(code)
            elif key == "items":
                if "prefixItems" in schema:
                    raise NotCompiled("prefixItems")
                w = self.name("v")
                code = self.schema(value, w, depth + 2)
                if code:
                    out.append(f"{pad}if isinstance({v}, list):\n{pad}    for {w} in {v}:\n")
                    out.extend(code)
            elif key == "anyOf":
                if not isinstance(value, list) or not value:
                    raise NotCompiled(key)
                conds = []
                for sub in value:
                    cond = self.type_condition(sub, v)
                    conds.append(f"({cond})" if cond is not None else f"{self.function(sub)}({v})")
                out.append(f"{pad}if not ({' or '.join(conds)}): return False\n")
            elif key == "allOf":
                if not isinstance(value, list) or not value:
                    raise NotCompiled(key)
                for sub in value:
                    out.extend(self.schema(sub, v, depth))
            elif key in ("enum", "const"):
                options = value if key == "enum" else [value]
                if not isinstance(options, list) or not all(o is None or isinstance(o, (str, bool, int))
                                                            for o in options):
                    raise NotCompiled(key)
                pairs = self.const(tuple((type(o), o) for o in options))
                out.append(f"{pad}if not _in_options({v}, {pairs}): return False\n")
            elif key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise NotCompiled(key)
                out.append(f"{pad}if not _number_in_bound({v}, {key!r}, {value!r}): return False\n")
            elif key in _SIZES:
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise NotCompiled(key)
                kind, op = _SIZES[key]
                out.append(f"{pad}if isinstance({v}, {kind}) and not len({v}) {op} {value}: return False\n")
            else:
                raise NotCompiled(key)
        return out


class FastAcceptValidator:
    """A ``jsonschema`` validator with :func:`compile_check` in front: ``iter_errors`` yields nothing at once
    when the compiled check accepts the instance, else exactly what the wrapped validator yields.

    Every other attribute is the wrapped validator's. Drop-in for the SDK client's cached output-schema
    validator (``agents.mcp_client.fast_result_validation``).
    """

    def __init__(self, validator: Any, check: Check):
        self.validator = validator
        self.check = check

    def iter_errors(self, instance: Any) -> Iterator[Any]:
        if self.check(instance):
            return iter(())
        return iter(self.validator.iter_errors(instance))

    def is_valid(self, instance: Any) -> bool:
        return self.check(instance) or self.validator.is_valid(instance)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.validator, name)
