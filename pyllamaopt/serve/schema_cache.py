"""Compiled JSON Schemas kept for the next request with the same schema (a large one takes seconds)."""
from __future__ import annotations

import collections
import json
from typing import Any

from ..errors import UnenforceableSchemaError
from ..grammar import SchemaGrammar, compile_json_schema
from .errors import BadRequest

SCHEMA_CACHE_SIZE = 32
#: the layout of JSON answers (--json-whitespace): a line break and indentation allowed, as models
#: write JSON (docs/structured-output.md measures it against json.dumps's one line)
DEFAULT_JSON_WHITESPACE = "indented"


class SchemaCache:
    def __init__(self, whitespace: str) -> None:
        self.whitespace = whitespace  # the server's layout of JSON answers (--json-whitespace)
        self._compiled: collections.OrderedDict[tuple[str, bool], SchemaGrammar] = collections.OrderedDict()

    def compiled(self, schema: dict[str, Any] | bool, strict: bool) -> SchemaGrammar:
        """`schema` compiled (`strict` as the request says), from the cache if an earlier request had
        the same. A strict request whose schema has a constraint no grammar enforces is refused with
        that constraint named."""
        key = (json.dumps(schema, sort_keys=True), strict)
        compiled = self._compiled.pop(key, None)
        if compiled is None:
            try:
                compiled = compile_json_schema(schema, strict=strict, whitespace=self.whitespace)
            except UnenforceableSchemaError as exc:
                raise BadRequest(f"response_format.json_schema.strict is true, but the schema's '{exc.keyword}' at "
                                 f"{exc.path} cannot be enforced by a grammar: {exc}. Remove that constraint, or "
                                 "set strict to false: what a grammar can enforce is, and the answer's "
                                 "pyllamaopt.schema_valid says whether the output is valid", type(exc)) from None
        self._compiled[key] = compiled
        while len(self._compiled) > SCHEMA_CACHE_SIZE:
            self._compiled.popitem(last=False)
        return compiled
