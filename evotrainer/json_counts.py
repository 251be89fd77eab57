"""Counts of a JSON text's structural characters, taken before it is parsed.

A parse builds one Python object per value, so the cost of refusing a hostile message or file after ``json.loads``
grows with what it holds; these counts bound it first, in C (``bytes.count``: about 1 ms for 4 MiB). Characters
inside strings are counted too, so each count is an upper bound on what a parse would make. Used by the MCP
envelope check (``servers/envelope.py``) and by ``compare --baseline`` (``agents/compare.py``).
"""

from __future__ import annotations


def as_bytes(raw: bytes | str) -> bytes:
    """``raw`` as bytes (a ``str`` encoded as UTF-8, lone surrogates kept)."""
    return raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")


def container_count(raw: bytes | str) -> int:
    """'[', '{' and ':' characters of ``raw``: an upper bound on the lists, objects and keys a parse makes."""
    b = as_bytes(raw)
    return b.count(b"[") + b.count(b"{") + b.count(b":")


def comma_count(raw: bytes | str) -> int:
    """',' characters of ``raw``: an upper bound on the values past the first of each list or object."""
    return as_bytes(raw).count(b",")


def quote_count(raw: bytes | str) -> int:
    """'"' characters of ``raw``: twice the strings a parse makes, plus escaped quotes."""
    return as_bytes(raw).count(b'"')
