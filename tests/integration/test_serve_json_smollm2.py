"""JSON answers (response_format) through the server on SmolLM2 135M Instruct, with the real clients
(issue 43): the model writes "{", a line break and indentation, which the server's default layout
(--json-whitespace indented) allows, so instructor's default JSON_SCHEMA mode gets a valid User
(refused that layout, under json.dumps's one line, the model spelled the key a character at a time
and derailed); --json-whitespace compact answers with no whitespace outside strings."""
from __future__ import annotations

import json
from collections.abc import Iterator

import instructor
import pytest
from pydantic import BaseModel

from test_serve import Server, start_server, stop_server

pytestmark = pytest.mark.integration

EXTRACT = [{"role": "user", "content": "Extract: Jason Miller is 25 years old."}]


class User(BaseModel):
    name: str
    age: int


@pytest.fixture(scope="module")
def served(smollm2_path, tmp_path_factory) -> Iterator[Server]:
    server = start_server(smollm2_path, tmp_path_factory.mktemp("json"))
    yield server
    stop_server(server)


def user_answer(server: Server) -> str:
    reply = server.client().chat.completions.create(
        model="m", messages=EXTRACT, max_tokens=80,
        response_format={"type": "json_schema", "json_schema": {"name": "User", "schema": User.model_json_schema()}})
    assert reply.choices[0].finish_reason == "stop", reply
    assert reply.model_extra["pyllamaopt"]["schema_valid"] is True, reply
    return reply.choices[0].message.content


def test_instructor_json_schema_mode_gets_a_valid_user(served):
    client = instructor.from_openai(served.client(), mode=instructor.Mode.JSON_SCHEMA)
    user = client.chat.completions.create(model="m", response_model=User, messages=EXTRACT, max_tokens=80,
                                          max_retries=1)  # one attempt: a re-ask would hide a bad first answer
    assert isinstance(user, User) and (user.name, user.age) == ("Jason Miller", 25), user


def test_the_model_writes_its_own_layout_and_compact_is_a_server_option(served, smollm2_path, tmp_path):
    indented = user_answer(served)
    assert json.loads(indented) == {"name": "Jason Miller", "age": 25}
    assert indented.startswith("{\n "), indented  # the layout the model chose (json.dumps's one line refused it)
    compact_server = start_server(smollm2_path, tmp_path, "--json-whitespace", "compact")
    try:
        compact = user_answer(compact_server)
    finally:
        stop_server(compact_server)
    assert compact == json.dumps(json.loads(compact), separators=(",", ":"), ensure_ascii=False), compact
