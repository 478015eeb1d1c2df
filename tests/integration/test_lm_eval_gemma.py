"""lm-eval (EleutherAI's harness) scoring a multiple-choice task against the server with its
`local-completions` model, the way evaluations use an OpenAI-compatible server: each choice is a
completion request with echo, logprobs 1 and one token to generate, and the harness sums the
prompt's continuation tokens' log-probabilities. Its per-item loglikelihoods (and is-greedy flags)
equal the library's for the same tokens (Session.score on a fresh context), bit for bit. The task's
data is a JSONL file and a task YAML written here (no network); the harness's tokenizer is the
model's own (an HF tokenizer would need the Hub), given to the harness model as its tokenizer."""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import lm_eval  # (the test extras: pip install 'pyllamaopt[test]')
import pytest

from pyllamaopt import Context, Model
from test_serve import N_CTX, Server, start_server, stop_server

pytestmark = pytest.mark.integration

QUESTIONS = [
    {"question": "The capital of France is", "choices": ["Paris", "Berlin", "a small dog"], "answer": 0},
    {"question": "Two plus two equals", "choices": ["four", "seven", "the moon"], "answer": 0},
    {"question": "The opposite of hot is", "choices": ["cold", "blue", "running"], "answer": 0},
    {"question": "Water freezes at zero degrees", "choices": ["Celsius", "pages", "trees"], "answer": 0},
]

TASK = """task: pyllamaopt_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""


class ModelTokenizer:
    """The model's tokenizer in the shape lm-eval's API models call (encode, eot_token)."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.eot_token = model.bos_token

    def encode(self, text: str) -> list[int]:
        return self.model.tokenize(text, add_bos=False)


@pytest.fixture(scope="module")
def server(gemma_path, tmp_path_factory) -> Iterator[Server]:
    s = start_server(gemma_path, tmp_path_factory.mktemp("lm-eval"))
    yield s
    stop_server(s)


def test_lm_evals_loglikelihoods_equal_the_librarys(server, gemma, tmp_path, monkeypatch):
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "pyllamaopt_choice.yaml").write_text(TASK.format(data=data))

    lm = LocalCompletionsAPI(base_url=server.url + "/v1/completions", model="gemma", tokenizer_backend=None,
                             max_length=N_CTX)
    # the harness's own code paths for a tokenizer other than HF's and tiktoken's
    lm.tokenizer_backend, lm.tokenizer, lm.tokenized_requests = "pyllamaopt", ModelTokenizer(gemma), True
    results = lm_eval.simple_evaluate(model=lm, tasks=["pyllamaopt_choice"], num_fewshot=0, log_samples=True,
                                      task_manager=TaskManager(include_path=str(tmp_path / "tasks")))
    samples = results["samples"]["pyllamaopt_choice"]
    assert len(samples) == len(QUESTIONS)

    with Context(gemma, n_ctx=N_CTX, n_threads=2) as ctx:
        for sample in samples:
            for (context, continuation), response in zip(sample["arguments"], sample["resps"], strict=True):
                context_tokens, continuation_tokens = lm._encode_pair(context, continuation)
                scored = ctx.session().score(context_tokens + continuation_tokens, top_logprobs=1)
                ours = scored[len(context_tokens):]
                expected = (sum(lp.logprob for lp in ours),
                            all(lp.top[0][1] == lp.logprob for lp in ours))
                assert tuple(response[0]) == expected, (context, continuation)
    assert results["results"]["pyllamaopt_choice"]["acc,none"] >= 0.5
