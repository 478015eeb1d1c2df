"""The ingress deployment: Ray Serve's HTTP proxy hands it every request; it says what the router
should place the request by (a session's replica, a prompt's block chain: affinity.py) and forwards
it to the engine deployment, streaming the answer back. A prompt's tokens are the engine's: the same
routes' request models, chat template and tokenizer (the model is memory-mapped, so a replica on the
same machine shares its pages)."""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

from prometheus_client import generate_latest
from pydantic import ValidationError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..chat import ChatTemplate
from ..config import OptConfig
from ..errors import ChatTemplateError, PyllamaoptError
from ..model import Model
from ..serve import ServeSettings, anthropic_routes, openai_routes
from ..serve.app import error_body
from ..serve.chat_answer import ChatRequest, render_chat
from ..serve.errors import Overloaded, ServiceError
from ..serve.schemas import ChatCompletionRequest, CompletionRequest, MessagesRequest
from .affinity import Affinity, prompt_chains, session_replica
from .forwarding import ForwardedRequest, ResponseStart
from .metrics_export import RayExport
from .router_metrics import REGISTRY

# seconds a client is told to wait when no engine replica can take its request (one is restarting)
RETRY_AFTER = 2


class Gateway:
    def __init__(self, engine: DeploymentHandle, settings: ServeSettings) -> None:
        self.engine = engine.options(stream=True)
        self.model = Model(settings.model)
        try:
            self.template: ChatTemplate | None = ChatTemplate.for_model(self.model, file=settings.chat_template_file)
        except ChatTemplateError:  # the replicas answer chat requests with the reason
            self.template = None
        self.n_ctx = settings.n_ctx
        self.block_size = OptConfig().block_size
        self.export = RayExport(REGISTRY)  # the router's counters (it routes in this process)

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        if request.method == "GET" and path == "/metrics/router":
            return Response(generate_latest(REGISTRY), media_type="text/plain; version=0.0.4")
        body = await request.body()
        forwarded = ForwardedRequest(request.method, path, request.scope.get("query_string", b""),
                                     tuple(request.scope["headers"]), body, await self._affinity(path, body))
        answer = cast(DeploymentResponseGenerator, self.engine.handle.remote(forwarded))  # (stream=True)
        try:
            start = await answer.__anext__()
        except (StopAsyncIteration, asyncio.CancelledError):
            raise
        except Exception as exc:  # the replica died or the cluster is going: the client may retry
            error = Overloaded(f"no engine replica could answer ({type(exc).__name__}); retry in {RETRY_AFTER} s")
            return JSONResponse(error_body(path, error), status_code=error.status,
                                headers={"Retry-After": str(RETRY_AFTER)})
        finally:
            self.export.update()  # the router's counters: it placed the request by now
        assert isinstance(start, ResponseStart)

        async def rest() -> AsyncIterator[bytes]:
            try:
                async for chunk in answer:
                    yield chunk
            finally:
                answer.cancel()  # (a client that left: the replica's generation stops)

        response = StreamingResponse(rest(), status_code=start.status)
        response.raw_headers = list(start.headers)
        return response

    async def _affinity(self, path: str, body: bytes) -> Affinity | None:
        replica = session_replica(path)
        if replica is not None:
            return Affinity(session_replica=replica)
        if path == "/v1/sessions":
            return Affinity(new_session=True)
        try:
            tokens = await self._prompt_tokens(path, body)
        except (ValueError, ValidationError, ServiceError, PyllamaoptError):  # the replica answers it with a 400
            return None
        return None if tokens is None else Affinity(chains=prompt_chains(tokens, self.block_size),
                                                    block_size=self.block_size)

    async def _prompt_tokens(self, path: str, body: bytes) -> list[int] | None:
        """The prompt's tokens as the replica's route computes them; None for a route without a prompt."""
        if path == "/v1/completions":
            prompt = CompletionRequest.model_validate(json.loads(body)).one_prompt()  # (a batch: the replica's 400)
            return prompt if isinstance(prompt, list) else await asyncio.to_thread(self.model.tokenize, prompt)
        surface = _CHAT_SURFACES.get(path)
        if surface is None or self.template is None:
            return None
        schema, chat_request = surface
        _, tokens, _ = await render_chat(self.template, self.model, chat_request(schema.model_validate(json.loads(body)),
                                                                                   self.n_ctx))
        return tokens


_CHAT_SURFACES: dict[str, tuple[Any, Callable[[Any, int], ChatRequest]]] = {
    "/v1/chat/completions": (ChatCompletionRequest, openai_routes.chat_request),
    "/v1/messages": (MessagesRequest, anthropic_routes.chat_request),
}
