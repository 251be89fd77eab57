"""A JSON Schema subset compiled to Python closures: a fast *accept* path in front of the ``jsonschema`` package.

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

Check = Callable[[Any], bool]

ANNOTATIONS = frozenset({"title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly",
                         "$comment", "format", "$id", "$anchor", "contentMediaType", "contentEncoding"})
"""Keywords that never reject an instance (``format`` is an annotation unless a format checker is given)."""

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"

_TYPES: dict[str, Check] = {
    "object": lambda x: isinstance(x, dict),
    "array": lambda x: isinstance(x, list),
    "string": lambda x: isinstance(x, str),
    "boolean": lambda x: isinstance(x, bool),
    "null": lambda x: x is None,
    # int / float only; bool is not a number in JSON Schema; an integral float is "not sure" (False)
    "integer": lambda x: isinstance(x, int) and not isinstance(x, bool),
    "number": lambda x: (isinstance(x, int) and not isinstance(x, bool)) or isinstance(x, float),
}


class NotCompiled(Exception):
    """The schema uses a keyword outside the compiled subset."""


def compile_check(schema: Any) -> Check | None:
    """A sound predicate for ``schema`` (see the module docstring), or None when it uses other keywords."""
    if isinstance(schema, dict) and schema.get("$schema", DRAFT_2020_12) != DRAFT_2020_12:
        return None
    try:
        return _compile(schema)
    except NotCompiled:
        return None


def _is_number(x: Any) -> bool:
    return _TYPES["number"](x)


def _compile(schema: Any) -> Check:  # noqa: C901 (one branch per keyword)
    if schema is True:
        return lambda x: True
    if schema is False or not isinstance(schema, dict):
        raise NotCompiled(repr(schema))
    checks: list[Check] = []
    for key, value in schema.items():
        if key in ANNOTATIONS or key == "$schema":
            continue
        if key == "type":
            names = [value] if isinstance(value, str) else value
            if not isinstance(names, list) or not names or any(n not in _TYPES for n in names):
                raise NotCompiled(f"type {value!r}")
            preds = [_TYPES[n] for n in names]
            checks.append(preds[0] if len(preds) == 1 else (lambda x, ps=tuple(preds): any(p(x) for p in ps)))
        elif key == "properties":
            if not isinstance(value, dict):
                raise NotCompiled("properties")
            props = tuple((name, _compile(sub)) for name, sub in value.items())
            checks.append(lambda x, props=props: not isinstance(x, dict)
                          or all(name not in x or c(x[name]) for name, c in props))
        elif key == "required":
            if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
                raise NotCompiled("required")
            req = tuple(value)
            checks.append(lambda x, req=req: not isinstance(x, dict) or all(n in x for n in req))
        elif key == "additionalProperties":
            if "patternProperties" in schema:
                raise NotCompiled("patternProperties")
            known = frozenset(schema.get("properties", {}))
            extra = _compile(value) if value is not False else None
            if extra is None:
                checks.append(lambda x, known=known: not isinstance(x, dict) or all(k in known for k in x))
            else:
                checks.append(lambda x, known=known, c=extra: not isinstance(x, dict)
                              or all(k in known or c(v) for k, v in x.items()))
        elif key == "items":
            if "prefixItems" in schema:
                raise NotCompiled("prefixItems")
            item = _compile(value)
            checks.append(lambda x, c=item: not isinstance(x, list) or all(c(v) for v in x))
        elif key in ("anyOf", "allOf"):
            if not isinstance(value, list) or not value:
                raise NotCompiled(key)
            subs = tuple(_compile(v) for v in value)
            if key == "anyOf":
                checks.append(lambda x, subs=subs: any(c(x) for c in subs))
            else:
                checks.append(lambda x, subs=subs: all(c(x) for c in subs))
        elif key in ("enum", "const"):
            options = value if key == "enum" else [value]
            if not isinstance(options, list) or not all(o is None or isinstance(o, (str, bool, int)) for o in options):
                raise NotCompiled(key)
            pairs = tuple((type(o), o) for o in options)
            checks.append(lambda x, pairs=pairs: any(type(x) is t and x == o for t, o in pairs))
        elif key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if not _is_number(value) or (isinstance(value, float) and not math.isfinite(value)):
                raise NotCompiled(key)
            checks.append(_bound(key, value))
        elif key in ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise NotCompiled(key)
            checks.append(_size(key, value))
        else:
            raise NotCompiled(key)
    if not checks:
        return lambda x: True
    if len(checks) == 1:
        return checks[0]
    all_checks = tuple(checks)
    return lambda x: all(c(x) for c in all_checks)


def _bound(key: str, limit: float) -> Check:
    """A numeric bound. It applies to numbers only (as in JSON Schema: not to bool, str, ...); a number other
    than int / float (``Decimal``, which ``jsonschema`` compares too) and NaN are "not sure"."""
    ops: dict[str, Callable[[Any], bool]] = {
        "minimum": lambda x: x >= limit, "maximum": lambda x: x <= limit,
        "exclusiveMinimum": lambda x: x > limit, "exclusiveMaximum": lambda x: x < limit}
    op = ops[key]

    def check(x: Any) -> bool:
        if isinstance(x, bool) or not isinstance(x, numbers.Number):
            return True
        if not _is_number(x) or (isinstance(x, float) and math.isnan(x)):
            return False
        return op(x)

    return check


def _size(key: str, n: int) -> Check:
    kind: type = str if key.endswith("Length") else list if key.endswith("Items") else dict
    if key.startswith("min"):
        return lambda x: not isinstance(x, kind) or len(x) >= n
    return lambda x: not isinstance(x, kind) or len(x) <= n


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
