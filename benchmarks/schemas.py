"""JSON Schemas typical of agents, for the structured-output benchmark (issue 6) and the
grammar tests (tests/test_grammar.py).

SCHEMAS is a list of (name, schema, prompt): the prompt asks a small base model (Gemma 3 270M)
for one JSON value of the schema. Every schema converts with
``pyllamaopt.grammar.json_schema_to_gbnf``.
"""
from __future__ import annotations

from typing import Any

_NO_EXTRA = {"additionalProperties": False}


def _tool_call(name: str, arguments: dict, required: list[str]) -> dict:
    return {
        "type": "object",
        "properties": {
            "name": {"const": name},
            "arguments": {"type": "object", "properties": arguments, "required": required, **_NO_EXTRA},
        },
        "required": ["name", "arguments"],
        **_NO_EXTRA,
    }


READ_FILE = _tool_call("read_file", {
    "path": {"type": "string", "minLength": 1, "description": "file to read"},
    "start_line": {"type": "integer", "minimum": 1},
    "end_line": {"type": "integer", "minimum": 1},
}, ["path", "start_line"])

WRITE_FILE = _tool_call("write_file", {
    "path": {"type": "string", "minLength": 1},
    "content": {"type": "string"},
    "overwrite": {"type": "boolean"},
}, ["path", "content"])

RUN_SHELL = _tool_call("run_shell", {
    "command": {"type": "string", "minLength": 1, "maxLength": 200},
    "timeout_s": {"type": "integer", "minimum": 1, "maximum": 600},
    "cwd": {"type": ["string", "null"]},
}, ["command", "timeout_s", "cwd"])

SEARCH_CODE = _tool_call("search_code", {
    "query": {"type": "string", "minLength": 1},
    "max_results": {"type": "integer", "minimum": 1, "maximum": 50},
    "file_glob": {"anyOf": [{"type": "string"}, {"type": "null"}]},
}, ["query"])

ANY_TOOL = {
    "$defs": {
        "ReadFile": READ_FILE,
        "WriteFile": WRITE_FILE,
        "SearchCode": SEARCH_CODE,
    },
    "oneOf": [{"$ref": "#/$defs/ReadFile"}, {"$ref": "#/$defs/WriteFile"}, {"$ref": "#/$defs/SearchCode"}],
}

HTTP_REQUEST = {
    "type": "object",
    "properties": {
        "method": {"enum": ["GET", "POST", "PUT", "DELETE"]},
        "url": {"type": "string", "minLength": 8},
        "headers": {"type": "object", "additionalProperties": {"type": "string"}},
        "body": {"type": ["string", "null"]},
    },
    "required": ["method", "url"],
    **_NO_EXTRA,
}

SENTIMENT = {
    "type": "object",
    "properties": {
        "sentiment": {"type": "string", "enum": ["positive", "negative", "neutral"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["sentiment", "confidence"],
    **_NO_EXTRA,
}

PERSON = {
    "title": "Person",
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 60},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "maxLength": 100},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 5},
    },
    "required": ["name", "age"],
    **_NO_EXTRA,
}

MEETING = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 80},
        "date": {"type": "string", "format": "date"},
        "start": {"type": "string", "format": "time"},
        "duration_min": {"type": "integer", "exclusiveMinimum": 0, "maximum": 480},
        "attendees": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    },
    "required": ["title", "date", "start", "attendees"],
    **_NO_EXTRA,
}

LOG_ENTRY = {
    "type": "object",
    "properties": {
        "timestamp": {"type": "string", "format": "date-time"},
        "level": {"enum": ["debug", "info", "warning", "error"]},
        "message": {"type": "string"},
        "request_id": {"type": "string", "format": "uuid"},
    },
    "required": ["timestamp", "level", "message"],
    **_NO_EXTRA,
}

TODO_LIST = {
    "type": "object",
    "properties": {
        "todos": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1},
                    "text": {"type": "string", "minLength": 1},
                    "done": {"type": "boolean"},
                },
                "required": ["id", "text", "done"],
                **_NO_EXTRA,
            },
            "minItems": 1,
            "maxItems": 10,
        },
    },
    "required": ["todos"],
    **_NO_EXTRA,
}

CLASSIFY = {
    "type": "object",
    "properties": {
        "label": {"enum": ["bug", "feature", "question", "docs"]},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
        "reasons": {"type": "array", "items": {"type": "string", "maxLength": 100}, "maxItems": 3},
    },
    "required": ["label", "priority"],
    **_NO_EXTRA,
}

ENTITIES = {
    "type": "object",
    "properties": {
        "entities": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "text": {"type": "string", "minLength": 1},
                    "kind": {"enum": ["person", "organization", "location", "date"]},
                },
                "required": ["text", "kind"],
                **_NO_EXTRA,
            },
        },
    },
    "required": ["entities"],
    **_NO_EXTRA,
}

PLAN = {
    "type": "object",
    "properties": {
        "goal": {"type": "string"},
        "steps": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "step": {"type": "integer", "minimum": 1, "maximum": 20},
                    "action": {"type": "string"},
                    "tool": {"enum": ["read_file", "write_file", "run_shell", "none"]},
                },
                "required": ["step", "action", "tool"],
                **_NO_EXTRA,
            },
            "maxItems": 8,
        },
        "done": {"type": "boolean"},
    },
    "required": ["goal", "steps", "done"],
    **_NO_EXTRA,
}

FILE_TREE = {
    "$defs": {
        "Node": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "kind": {"enum": ["file", "dir"]},
                "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
            },
            "required": ["name", "kind"],
            **_NO_EXTRA,
        },
    },
    "$ref": "#/$defs/Node",
}

EXPRESSION = {
    "definitions": {
        "expr": {
            "anyOf": [
                {"type": "integer"},
                {
                    "type": "object",
                    "properties": {
                        "op": {"enum": ["+", "-", "*", "/"]},
                        "left": {"$ref": "#/definitions/expr"},
                        "right": {"$ref": "#/definitions/expr"},
                    },
                    "required": ["op", "left", "right"],
                    **_NO_EXTRA,
                },
            ],
        },
    },
    "$ref": "#/definitions/expr",
}

PLACE = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "coordinates": {
            "type": "array",
            "prefixItems": [
                {"type": "number", "minimum": -90, "maximum": 90},
                {"type": "number", "minimum": -180, "maximum": 180},
            ],
            "items": False,
        },
        "country_code": {"type": "string", "minLength": 2, "maxLength": 2},
    },
    "required": ["name", "coordinates"],
    **_NO_EXTRA,
}

COMMIT_MESSAGE = {
    "type": "object",
    "properties": {
        "type": {"enum": ["feat", "fix", "docs", "refactor", "test", "chore"]},
        "scope": {"type": ["string", "null"], "maxLength": 20},
        "subject": {"type": "string", "minLength": 1, "maxLength": 72},
        "breaking": {"type": "boolean"},
    },
    "required": ["type", "scope", "subject", "breaking"],
    **_NO_EXTRA,
}

CONFIG_SET = {
    "type": "object",
    "properties": {
        "key": {"type": "string", "minLength": 1},
        "value": {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"}]},
    },
    "required": ["key", "value"],
    **_NO_EXTRA,
}

CITED_ANSWER = {
    "type": "object",
    "properties": {
        "answer": {"type": "string"},
        "citations": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"source": {"type": "string"}, "quote": {"type": "string", "maxLength": 200}},
                "required": ["source", "quote"],
                **_NO_EXTRA,
            },
            "maxItems": 3,
        },
    },
    "required": ["answer", "citations"],
    **_NO_EXTRA,
}

AGENT_STEP = {
    "type": "object",
    "properties": {
        "thought": {"type": "string", "maxLength": 200},
        "action": {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {
                        "type": {"const": "tool"},
                        "tool": {"type": "string", "minLength": 1},
                        "input": {"type": "object", "additionalProperties": {"type": "string"}},
                    },
                    "required": ["type", "tool", "input"],
                    **_NO_EXTRA,
                },
                {
                    "type": "object",
                    "properties": {"type": {"const": "final"}, "answer": {"type": "string"}},
                    "required": ["type", "answer"],
                    **_NO_EXTRA,
                },
            ],
        },
    },
    "required": ["thought", "action"],
    **_NO_EXTRA,
}

AVAILABILITY = {
    "type": "object",
    "properties": {
        "date": {"type": "string", "format": "date"},
        "slots": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "start": {"type": "string", "format": "time"},
                    "end": {"type": "string", "format": "time"},
                },
                "required": ["start", "end"],
                **_NO_EXTRA,
            },
            "maxItems": 6,
        },
    },
    "required": ["date", "slots"],
    **_NO_EXTRA,
}

PRODUCT = {
    "type": "object",
    "properties": {
        "sku": {"type": "string", "minLength": 4, "maxLength": 12},
        "price": {"type": "number", "minimum": 0},
        "currency": {"enum": ["USD", "EUR", "GBP"]},
        "in_stock": {"type": "boolean"},
        "quantity": {"type": "integer", "minimum": 0},
    },
    "required": ["sku", "price", "currency", "in_stock"],
    **_NO_EXTRA,
}

YES_NO = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "explanation": {"type": "string", "maxLength": 120}},
    "required": ["answer"],
    **_NO_EXTRA,
}

METADATA = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "labels": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 40}},
        "extra": {"type": "object"},
    },
    "required": ["id", "labels"],
    "additionalProperties": {"type": ["integer", "boolean"]},
}

TICKET = {
    "$defs": {
        "Base": {
            "type": "object",
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                "created": {"type": "string", "format": "date-time"},
            },
            "required": ["id", "created"],
        },
    },
    "allOf": [
        {"$ref": "#/$defs/Base"},
        {
            "properties": {
                "title": {"type": "string", "minLength": 1, "maxLength": 100},
                "priority": {"enum": ["low", "medium", "high"]},
            },
            "required": ["title", "priority"],
        },
    ],
}

SCHEMAS: list[tuple[str, Any, str]] = [
    ("read_file", READ_FILE,
     'Call the read_file tool to read lines 10 to 40 of "src/app.py". Answer with JSON only.\n'),
    ("write_file", WRITE_FILE,
     'Call the write_file tool to write "hello" to notes.txt. Answer with JSON only.\n'),
    ("run_shell", RUN_SHELL,
     "Call the run_shell tool to list the files of /tmp, with a 30 second timeout. Answer with JSON only.\n"),
    ("search_code", SEARCH_CODE,
     'Call the search_code tool to find "def main" in Python files. Answer with JSON only.\n'),
    ("any_tool", ANY_TOOL,
     "Pick one tool (read_file, write_file or search_code) to look at README.md. Answer with JSON only.\n"),
    ("http_request", HTTP_REQUEST,
     "Describe an HTTP request that fetches https://example.com/api/users as JSON.\n"),
    ("sentiment", SENTIMENT,
     'Classify the sentiment of "I love this phone, the battery lasts forever." as JSON.\n'),
    ("person", PERSON,
     "Give a JSON record for Ada Lovelace, aged 36, with two tags.\n"),
    ("meeting", MEETING,
     "Schedule a 30 minute team sync on 2025-03-14 at 10:00 UTC with Ann and Bob, as JSON.\n"),
    ("log_entry", LOG_ENTRY,
     "Write one JSON log entry for a failed database connection.\n"),
    ("todo_list", TODO_LIST,
     "Make a JSON todo list with three chores for today.\n"),
    ("classify_issue", CLASSIFY,
     'Classify the issue "App crashes when I click Save" as JSON.\n'),
    ("entities", ENTITIES,
     'Extract the named entities from "Marie Curie moved to Paris in 1891." as JSON.\n'),
    ("plan", PLAN,
     "Plan, as JSON, the steps to fix a failing unit test.\n"),
    ("file_tree", FILE_TREE,
     "Describe, as a JSON tree, a project folder with a README.md and a src folder holding main.py.\n"),
    ("expression", EXPRESSION,
     "Write the arithmetic expression (2 + 3) * 4 as a JSON syntax tree.\n"),
    ("place", PLACE,
     "Give the name and coordinates [latitude, longitude] of Paris as JSON.\n"),
    ("commit_message", COMMIT_MESSAGE,
     "Write a conventional commit, as JSON, for fixing a typo in the docs.\n"),
    ("config_set", CONFIG_SET,
     "Set the configuration key max_retries to 5. Answer with JSON only.\n"),
    ("cited_answer", CITED_ANSWER,
     "What is the boiling point of water at sea level? Answer as JSON with one citation.\n"),
    ("agent_step", AGENT_STEP,
     "You are an agent. Decide your next step to find today's weather, as JSON.\n"),
    ("availability", AVAILABILITY,
     "List, as JSON, two free one-hour slots on 2025-06-02.\n"),
    ("product", PRODUCT,
     "Describe, as JSON, a product: a blue mug that costs 12.5 euros, 40 in stock.\n"),
    ("yes_no", YES_NO,
     "Is Python dynamically typed? Answer as JSON.\n"),
    ("metadata", METADATA,
     "Give JSON metadata for a dataset: an id, two labels and a version number.\n"),
    ("ticket", TICKET,
     "Open a support ticket, as JSON, about a login page that does not load.\n"),
]
