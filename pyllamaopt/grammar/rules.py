"""The named rules of a grammar under construction: allocation, sharing of equal bodies,
repetitions within llama.cpp's limits, and the output (only what ``root`` reaches, checked for
what llama.cpp refuses)."""
from __future__ import annotations

import re
from typing import Callable

from ..errors import GrammarError
from .gbnf import (EMPTY, Node, alt, is_atom, left_refs, is_nullable, is_productive, repeat, render, seq,
                   walk_refs)


# llama.cpp turns S{m,n} with n > 2000 into S{m,} (and refuses m > 2000); longer repetitions


# are written as chunks of _CHUNK


_LLAMA_REP_LIMIT = 2000


_CHUNK = 1000


def _sanitize(hint: str) -> str:
    hint = re.sub(r"([a-z0-9])([A-Z])", r"\1-\2", hint).lower()
    hint = re.sub(r"[^a-z0-9]+", "-", hint).strip("-")
    return hint or "r"


class Rules:
    """The rules of the grammar being built (the converter's base): equal bodies share a rule."""

    def __init__(self) -> None:
        self.rules: dict[str, Node | None] = {}   # name -> body (None while being built)
        self.by_body: dict[Node, str] = {}
        self.shared: dict[str, Node] = {}
        self.suffix: dict[str, int] = {}  # base name -> the last suffix tried (probing from 2 each time was quadratic)

    def alloc(self, hint: str) -> str:
        base = _sanitize(hint)
        name, n = base, self.suffix.get(base, 1)
        if n > 1:
            name = f"{base}-{n}"
        while name in self.rules:
            n += 1
            name = f"{base}-{n}"
        self.suffix[base] = n
        self.rules[name] = None
        return name

    def define(self, hint: str, body: Node, name: str | None = None) -> Node:
        if name is not None:
            self.rules[name] = body
            return ("ref", name)
        if body[0] == "ref":
            return body
        if body in self.by_body:
            return ("ref", self.by_body[body])
        name = self.alloc(hint)
        self.rules[name] = body
        self.by_body[body] = name
        return ("ref", name)

    def simple(self, node: Node, hint: str) -> Node:
        """A node llama.cpp may repeat {m,n} times (it counts the rules inside a group)."""
        if is_atom(node):
            return node
        if node[0] in ("seq", "alt") and all(is_atom(p) for p in node[1]):
            return node
        return self.define(hint, node)

    def rep(self, node: Node, lo: int, hi: int | None, hint: str) -> Node:
        if hi is not None and hi < lo:
            raise AssertionError((lo, hi))
        if hi == 0 or node == EMPTY:
            return EMPTY
        # (Y?){lo,hi}, and (Y{0,k}){lo,hi}, accept what Y{0,hi·k} does: each copy may be empty. As a
        # repetition of something empty, llama.cpp's grammar tracks every way of splitting the Ys
        # among the copies: (a?){400} took seconds a token, ((a?){50}){50} minutes
        while node[0] == "rep" and node[2] == 0:
            node, lo, hi = node[1], 0, None if node[3] is None or hi is None else node[3] * hi
        if lo == 1 and hi == 1:
            return node
        if not is_atom(node) and max(lo, hi or 0) > 100:
            node = self.define(hint, node)  # llama.cpp counts the rules a repeated group creates
        node = self.simple(node, hint)
        if lo <= _LLAMA_REP_LIMIT and (hi is None or hi <= _LLAMA_REP_LIMIT):
            return repeat(node, lo, hi)
        if lo > _LLAMA_REP_LIMIT * _CHUNK or (hi is not None and hi > _LLAMA_REP_LIMIT * _CHUNK):
            raise GrammarError(f"a repetition bound of {hi or lo} is too large for a grammar "
                               f"(at most {_LLAMA_REP_LIMIT * _CHUNK}); lower minLength/maxLength/"
                               "minItems/maxItems")
        chunk = self.define(f"{hint}-x{_CHUNK}", repeat(node, _CHUNK, _CHUNK))
        q, r = divmod(lo, _CHUNK)
        mandatory = seq(repeat(chunk, q, q), repeat(node, r, r))
        if hi is None:
            return seq(mandatory, repeat(node, 0, None))
        d = hi - lo
        if d <= _LLAMA_REP_LIMIT:
            return seq(mandatory, repeat(node, 0, d))
        a, b = divmod(d, _CHUNK)
        upto = alt(seq(repeat(chunk, 0, a - 1), repeat(node, 0, _CHUNK - 1)),
                   seq(repeat(chunk, a, a), repeat(node, 0, b)))
        return seq(mandatory, upto)

    def shared_rule(self, key: str, build: Callable[[], Node]) -> Node:
        if key not in self.shared:
            self.shared[key] = self.define(key, build())
        return self.shared[key]

    # ---- output

    def reachable(self) -> dict[str, Node]:
        """The rules root reaches, breadth first from root."""
        order, todo = ["root"], 0
        seen = {"root"}
        reached: dict[str, Node] = {}
        while todo < len(order):
            name = order[todo]
            body = self.rules[name]
            todo += 1
            if body is None:
                raise AssertionError(f"rule {name} has no body")
            reached[name] = body
            refs: list[str] = []
            walk_refs(body, refs)
            for r in refs:
                if r not in seen:
                    seen.add(r)
                    order.append(r)
        return reached

    def hoist(self, node: Node, name: str) -> Node:
        """``node`` with every repeated group that holds other groups made a rule of its own:
        llama.cpp refuses a repetition of a group when the rules the group creates times the
        count exceed 2000 ("exceeds sane defaults"); a rule reference counts as one."""
        kind = node[0]
        if kind in ("seq", "alt"):
            return (kind, tuple(self.hoist(p, name) for p in node[1]))
        if kind == "rep":
            child = self.hoist(node[1], name)
            if child[0] in ("seq", "alt") and not all(is_atom(p) for p in child[1]):
                child = self.define(f"{name}-part", child)
            return ("rep", child, node[2], node[3])
        return node

    def finish(self) -> str:
        for name in list(self.rules):
            body = self.rules[name]
            if body is not None:
                self.rules[name] = self.hoist(body, name)
        rules = self.reachable()
        # a rule that is only another rule's name takes that rule's body, if nothing else uses it
        counts: dict[str, int] = {}
        for b in rules.values():
            refs: list[str] = []
            walk_refs(b, refs)
            for r in refs:
                counts[r] = counts.get(r, 0) + 1
        for n, b in rules.items():  # self.rules[n] is still b: only rules already visited change
            if b[0] == "ref" and b[1] != n and counts.get(b[1]) == 1:
                self.rules[n] = self.rules[b[1]]
        rules = self.reachable()
        # nullable rules, then left recursion (llama.cpp rejects it) and rules with no finite string
        users: dict[str, set[str]] = {n: set() for n in rules}  # rule -> the rules that refer to it
        for n, b in rules.items():
            refs = []
            walk_refs(b, refs)
            for r in refs:
                users[r].add(n)
        nullable = _least_fixpoint(rules, users, is_nullable)
        prod = _least_fixpoint(rules, users, is_productive)
        bad = [n for n in rules if n not in prod]
        if bad:
            raise GrammarError(f"the JSON Schema only admits infinitely nested values (through {bad[0]!r}): a "
                               "recursive $ref must be optional somewhere (not required, or in an array "
                               "that may be empty, or one alternative of an anyOf)")
        starts: dict[str, set[str]] = {}
        for n, b in rules.items():
            starts[n] = set()
            left_refs(b, nullable, starts[n])
        looped = _on_a_cycle(starts)
        if looped is not None:
            raise GrammarError(f"the JSON Schema refers to itself (through {looped!r}) without an enclosing "
                               "object or array (e.g. anyOf/allOf of its own $ref): such a schema "
                               "adds nothing; remove the self-reference")
        return "".join(f"{n} ::= {render(b)}\n" for n, b in rules.items())


def _least_fixpoint(rules: dict[str, Node], users: dict[str, set[str]],
                    holds: Callable[[Node, set[str]], bool]) -> set[str]:
    """The rules a monotone property holds for (nullable, productive), each rule checked again
    only when a rule it refers to gained the property."""
    found: set[str] = set()
    todo = list(rules)
    queued = set(todo)
    while todo:
        n = todo.pop()
        queued.discard(n)
        if n not in found and holds(rules[n], found):
            found.add(n)
            for user in users[n]:
                if user not in found and user not in queued:
                    todo.append(user)
                    queued.add(user)
    return found


def _on_a_cycle(edges: dict[str, set[str]]) -> str | None:
    """A node on a cycle of the graph (iterative depth-first search), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in edges:
        if start in state:
            continue
        stack = [(start, iter(edges[start]))]
        state[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return nxt
            elif nxt not in state:
                state[nxt] = 1
                stack.append((nxt, iter(edges.get(nxt, ()))))
    return None
