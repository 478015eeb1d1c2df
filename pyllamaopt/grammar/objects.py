"""The rules of an object schema: properties (required or not, in schema order),
patternProperties, additionalProperties, minProperties/maxProperties."""
from __future__ import annotations

from typing import Any

from ..errors import UnsupportedRegexError
from .composition import all_of
from .gbnf import EMPTY, Node, alt, gbnf_char, literal, optional, repeat, seq
from .json_values import json_text
from .regex import Regex, may_overlap
from .regex_rules import regex_node
from .schema import Unsatisfiable, as_count, pointer_escape, unenforceable
from .strings import StringRules


class ObjectRules(StringRules):
    """An object schema's rule (gen_object), and the braces and commas around the members (on
    the string rules: keys are strings)."""

    def gen_object(self, schema: dict, hint: str, path: str) -> Node:
        props = schema.get("properties", {})
        required = schema.get("required", [])
        patterns = []
        for p, sub in schema.get("patternProperties", {}).items():
            try:
                patterns.append((self.regex(p, f"{path}/patternProperties", "patternProperties"), sub))
            except UnsupportedRegexError as e:  # relaxed: keys of that pattern are not produced
                self.relax(e)
        addl = schema.get("additionalProperties")
        if addl is None:
            addl = schema.get("unevaluatedProperties")
        if addl is None:  # absent: none when properties are listed (canonical form), else anything
            addl = False if "properties" in schema or patterns else True
        names = list(props) + [r for r in required if r not in props]
        fields: list[tuple[Node, bool]] = []
        for name in names:
            # a declared name is checked by its properties schema and by every pattern it matches;
            # additionalProperties only applies to names that are neither
            matching = [sub for rx, sub in patterns if rx.search(name)]
            sub = all_of([props[name] if name in props else (True if matching else addl), *matching])
            is_req = name in required
            sub_path = f"{path}/properties/{pointer_escape(name)}"
            try:
                value = self.gen(sub, f"{hint}-{name}", sub_path)
            except Unsatisfiable as e:
                if is_req:
                    raise Unsatisfiable(sub_path, f"required property {name!r} admits no value ({e})") from None
                continue
            fields.append((seq(literal(json_text(name)), self.colon(), value), is_req))
        extras: list[Node] = []
        if patterns:
            extras = self.pattern_extras(patterns, names, hint, path)
        elif addl is not False:
            try:
                value = self.gen(addl, f"{hint}-value", f"{path}/additionalProperties")
            except Unsatisfiable:
                pass  # no value is allowed: no other properties
            else:
                key = self.key_excluding(names, f"{hint}-key") if names else self.string()
                extras.append(seq(key, self.colon(), value))
        extra = self.simple(alt(*extras), f"{hint}-extra") if extras else None
        n_req = sum(1 for _, r in fields if r)
        nonempty = False
        if "minProperties" in schema:
            m = as_count(schema["minProperties"], path, "minProperties")
            if m == 1 and n_req == 0:  # at least one of the optional properties (or another key)
                if not fields and extra is None:
                    raise Unsatisfiable(path, "'minProperties' 1, but no property is allowed")
                nonempty = True
            elif m > n_req:
                self.relax(unenforceable(path, "minProperties", f"'minProperties' {m} is more than the {n_req} "
                                         "required properties; the grammar counts optional ones only for "
                                         "'minProperties' 1: list enough properties in 'required'"))
        max_extra = None
        if "maxProperties" in schema:
            m = as_count(schema["maxProperties"], path, "maxProperties")
            if m < n_req:
                raise Unsatisfiable(path, f"'maxProperties' {m} is less than the required properties")
            if extra is not None and n_req == len(fields):  # all declared ones present: count the others
                max_extra = m - n_req
                if max_extra == 0:
                    extra = None
            elif extra is not None or m < len(fields):
                self.relax(unenforceable(path, "maxProperties", f"'maxProperties' {m} cannot be expressed (the "
                                         "object may have more properties); drop it, or set "
                                         f"'additionalProperties': false and list at most {m} properties"))
        return self.define(hint, self.object_body(fields, extra, hint, nonempty, max_extra))

    def pattern_extras(self, patterns: list[tuple[Regex, Any]], names: list[str], hint: str, path: str
                       ) -> list[Node]:
        """The other properties an object with patternProperties has: for each pattern, keys that
        match it, with values of its schema and of the schemas of the patterns the key may match
        too. Keys that match no pattern are not produced (a narrowing, whatever
        additionalProperties says), nor keys of a pattern that a declared name also matches
        (unless every key matches it): they could repeat a declared key."""
        out = []
        for i, (rx, sub) in enumerate(patterns):
            if rx.universal:
                key = self.key_excluding(names, f"{hint}-key") if names else self.string()
            elif any(rx.search(n) for n in names):
                continue
            else:
                found = regex_node(rx, 0, None, self.rep, self.define, f"{hint}-key")
                if found is None:
                    continue
                key = found
            others = [s for j, (ry, s) in enumerate(patterns) if j != i and may_overlap(rx, ry)]
            try:
                value = self.gen(all_of([sub, *others]), f"{hint}-value",
                                 f"{path}/patternProperties/{pointer_escape(rx.source)}")
            except Unsatisfiable:
                continue
            out.append(seq(key, self.colon(), value))
        return out

    def object_body(self, fields: list[tuple[Node, bool]], extra: Node | None, hint: str, nonempty: bool = False,
                    max_extra: int | None = None) -> Node:
        """The members of an object: ``fields`` (key-value, required?) in order, then any number
        (at most ``max_extra``) of ``extra`` ones; with ``nonempty``, at least one member."""
        comma = self.comma()
        more = self.rep(seq(comma, extra), 0, max_extra, f"{hint}-more") if extra is not None else EMPTY
        if any(r for _, r in fields):
            first = next(i for i, (_, r) in enumerate(fields) if r)
            parts = [optional(seq(kv, comma)) for kv, _ in fields[:first]] + [fields[first][0]]
            parts += [seq(comma, kv) if r else optional(seq(comma, kv)) for kv, r in fields[first + 1:]]
            return self.bracket("{", seq(*parts, more), False, "}")
        kvs = [kv for kv, _ in fields]
        if len(kvs) <= 4:  # one alternative per first property present
            alts = [seq(kv, *(optional(seq(comma, k)) for k in kvs[i + 1:]), more) for i, kv in enumerate(kvs)]
            if extra is not None:
                alts.append(seq(extra, more if max_extra is None else
                                self.rep(seq(comma, extra), 0, max_extra - 1, f"{hint}-more")))
            return self.bracket("{", alt(*alts) if alts else EMPTY, not nonempty, "}")
        # the same in rules linear in the number of properties: rest[i] = the properties from i on,
        # each after a comma; first[i] = the first present one from i on, then rest
        tail: Node = more
        head: Node = seq(extra, more) if extra is not None else EMPTY
        for i in reversed(range(len(kvs))):
            after = tail
            tail = self.define(f"{hint}-rest", seq(optional(seq(comma, kvs[i])), tail))
            head = self.define(f"{hint}-first", alt(seq(kvs[i], after), head) if head != EMPTY
                               else seq(kvs[i], after))
        return self.bracket("{", head, not nonempty, "}")

    def key_excluding(self, names: list[str], hint: str) -> Node:
        """A JSON string key (without escapes) that is none of ``names``."""
        kc = '"\\\\\\x00-\\x1F'
        kchar = self.shared_rule("key-char", lambda: ("cls", f"[^{kc}]"))
        trie: dict = {}
        for name in names:
            if any(c in '"\\' or ord(c) < 0x20 or 0xD800 <= ord(c) <= 0xDFFF for c in name):
                continue  # cannot be written without escapes: never produced anyway
            node = trie
            for c in name:
                node = node.setdefault(c, {})
            node[""] = {}

        def build(node: dict, label: str) -> Node:
            children = sorted(c for c in node if c)
            if not children:  # a listed name: any continuation makes it another key
                return repeat(kchar, 1, None)
            excluded = "".join(gbnf_char(c, True) for c in children)
            alts = [EMPTY] if "" not in node else []
            alts.append(seq(("cls", f"[^{kc}{excluded}]"), repeat(kchar, 0, None)))
            for i, c in enumerate(children):
                alts.append(seq(literal(c), build(node[c], f"{label}-{i}")))
            return self.define(label, alt(*alts))

        return seq(literal('"'), build(trie, hint), literal('"'))
