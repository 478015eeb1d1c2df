"""The rules of an array schema: prefixItems then items (or the draft 4 list form),
minItems/maxItems."""
from __future__ import annotations

from .base import ConverterBase
from .gbnf import EMPTY, Node, seq
from .schema import Unsatisfiable, as_count, schema_error, unenforceable


class ArrayRules(ConverterBase):
    """An array schema's rule (gen_array), and the brackets and commas around the items."""

    def gen_array(self, schema: dict, hint: str, path: str) -> Node:
        prefix = schema.get("prefixItems")
        items = schema.get("items")
        if isinstance(items, list):  # draft 4-2019: items as a list, additionalItems for the rest
            if prefix is not None:
                raise schema_error(path, "'items' is a list and 'prefixItems' is given; use 'prefixItems' only")
            prefix, items = items, schema.get("additionalItems")
        if prefix is not None and not isinstance(prefix, list):
            raise schema_error(path, "'prefixItems' must be a list of schemas")
        prefix = prefix or []
        if items is None:
            items = schema.get("unevaluatedItems")
        if items is None:  # absent: none after prefixItems (canonical form), else anything
            items = False if prefix else True
        lo = as_count(schema.get("minItems", 0), path, "minItems")
        hi = schema.get("maxItems")
        hi = None if hi is None else as_count(hi, path, "maxItems")
        if hi is not None and hi < lo:
            raise Unsatisfiable(path, f"maxItems {hi} < minItems {lo}")
        if schema.get("uniqueItems") is True and (hi is None or hi > 1):
            self.relax(unenforceable(path, "uniqueItems", "'uniqueItems': true is not supported (a grammar "
                                     "cannot compare items); drop it and check after generation, or use "
                                     "'prefixItems' with distinct 'const's"))
        heads: list[Node] = []
        for i, sub in enumerate(prefix):
            if hi is not None and i >= hi:
                break
            try:
                heads.append(self.gen(sub, f"{hint}-{i}", f"{path}/prefixItems/{i}"))
            except Unsatisfiable:
                hi = i if hi is None else min(hi, i)  # the array must end before this item
                break
        rest = None
        if len(heads) == len(prefix):
            try:
                rest = self.gen(items, f"{hint}-item", f"{path}/items")
            except Unsatisfiable:
                pass
        n = len(heads)
        if rest is None:
            hi = n if hi is None else min(hi, n)
        if hi is not None and lo > hi:
            raise Unsatisfiable(path, f"minItems {lo} but at most {hi} items can be valid (set 'items' for the items "
                                "after 'prefixItems')")
        return self.define(hint, self.array_body(heads, rest, lo, hi, hint))

    def array_body(self, heads: list[Node], rest: Node | None, lo: int, hi: int | None, hint: str) -> Node:
        comma = self.comma()
        # canonical form: all prefix items are present (callers cut them at maxItems), then the others
        n = len(heads)
        if n == 0:
            if rest is None or hi == 0:
                return self.bracket("[", EMPTY, True, "]")
            tail = self.rep(seq(comma, rest), max(lo - 1, 0), None if hi is None else hi - 1, f"{hint}-more")
            return self.bracket("[", seq(rest, tail), lo == 0, "]")
        parts = [heads[0]] + [seq(comma, h) for h in heads[1:n]]
        if rest is not None and (hi is None or hi > n):
            parts.append(self.rep(seq(comma, rest), max(lo - n, 0), None if hi is None else hi - n, f"{hint}-more"))
        return self.bracket("[", seq(*parts), False, "]")
