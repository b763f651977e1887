"""The Starlette application: /v1/completions, /v1/chat/completions (streamed as server-sent events in
OpenAI's chunk format, ending with ``data: [DONE]``), /v1/models, /health."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from ..errors import PrismError
from .schemas import BadRequest, Completion, StopMatcher, parse
from .slots import QueueFull, Slots
from .templates import TEMPLATE_KEY, ChatTemplate

RETRY_AFTER_S = 1


def _error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
    from starlette.responses import JSONResponse
    if param and param not in message:
        message = f"'{param}': {message}"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}},
                        status_code=status, headers={"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None)


class Server:
    def __init__(self, model: Any, engine: Any, *, name: str, n_parallel: int, n_queue: int,
                 template: ChatTemplate | None) -> None:
        self.model, self.engine, self.template = model, engine, template
        # the model builds its tokenizer (and end-of-generation set) on first use: a quarter of a second for
        # Gemma's 262k-token vocabulary, which the first request's time to first token would otherwise pay
        _ = model.tokenizer, model.eog_ids
        self.names = (name,)
        self.slots = Slots(n_parallel, n_queue)
        self.created = int(time.time())

    # ------------------------------------------------------------ the prompt's ids, checked
    def _ids(self, req: Completion) -> tuple[list[int], str]:
        tok = self.model.tokenizer
        if req.chat:
            if self.template is None:
                raise BadRequest("messages", f"the model file has no chat template (metadata key {TEMPLATE_KEY!r} "
                                             "is missing); start the server with --chat-template NAME")
            text = self.template.render(req.prompt)
            bos = self.template.bos_token
            add = not (bos and text.startswith(bos))  # the template wrote BOS itself: not twice
            ids = tok.encode(text, add_special=add, parse_special=True) if text else []
            field = "messages"
        elif isinstance(req.prompt, str):
            ids = tok.encode(req.prompt, add_special=True, parse_special=True)
            field = "prompt"
        else:
            ids, field = list(req.prompt), "prompt"
            n_vocab = self.model.hparams.n_vocab
            bad = [t for t in ids if not 0 <= t < n_vocab]
            if bad:
                raise BadRequest("prompt", f"token id {bad[0]} is outside the vocabulary [0, {n_vocab})")
        n_ctx = self.model.cache.n_ctx
        if not ids:
            raise BadRequest(field, "the prompt is empty and the vocabulary adds no BOS token")
        if len(ids) >= n_ctx:
            raise BadRequest(field, f"the prompt is {len(ids)} tokens; the context holds {n_ctx} (at least one "
                                    "must be left to generate)")
        if req.max_tokens is not None and len(ids) + req.max_tokens > n_ctx:
            raise BadRequest("max_tokens", f"max_tokens={req.max_tokens} and the prompt's {len(ids)} tokens exceed "
                                           f"the context of {n_ctx} tokens")
        return ids, field

    # ------------------------------------------------------------ endpoints
    async def health(self, request):
        from starlette.responses import JSONResponse
        s = self.slots
        return JSONResponse({"status": "ok", "slots_idle": s.n_slots - s.active, "slots_processing": s.active,
                             "queued": s.waiting, "kv_cells_used": self.model.cache.used()})

    async def models(self, request):
        from starlette.responses import JSONResponse
        return JSONResponse({"object": "list", "data": [
            {"id": n, "object": "model", "created": self.created, "owned_by": "prism",
             "meta": {"n_ctx": self.model.cache.n_ctx, "n_vocab": self.model.hparams.n_vocab}}
            for n in self.names]})

    async def completions(self, request):
        return await self._complete(request, chat=False)

    async def chat(self, request):
        return await self._complete(request, chat=True)

    async def _complete(self, request, *, chat: bool):
        from starlette.concurrency import run_in_threadpool
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as e:
            return _error(400, f"the request body is not valid JSON: {e}")
        try:
            req = parse(body, chat=chat, model_names=self.names)
            ids, _ = await run_in_threadpool(self._ids, req)
        except BadRequest as e:
            return _error(400, str(e), e.param)
        except PrismError as e:
            return _error(400, str(e), "messages" if chat else "prompt")
        max_tokens = req.max_tokens if req.max_tokens is not None else self.model.cache.n_ctx - len(ids)
        try:
            await self.slots.acquire()
        except QueueFull:
            return _error(503, f"the server is busy: {self.slots.n_slots} slots and {self.slots.n_queue} queued "
                               "requests; retry later", kind="server_busy")
        try:
            job = await run_in_threadpool(self.engine.submit, ids, max_tokens, req.sampler)
        except PrismError as e:
            await self.slots.release()
            return _error(400, str(e), "prompt")
        meta = {"id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24], "created": int(time.time()),
                "model": self.names[0]}
        if req.stream:
            return self._stream(job, req, meta, chat)
        try:
            text, finish = await run_in_threadpool(_collect, job, req.stop)
        except PrismError as e:
            return _error(400, str(e))
        finally:
            await self.slots.release()
        usage = _usage(job)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        from starlette.responses import JSONResponse
        return JSONResponse({**meta, "object": obj, "choices": [choice], "usage": usage})

    def _stream(self, job, req: Completion, meta: dict, chat: bool):
        from anyio import to_thread
        from starlette.responses import StreamingResponse
        obj = "chat.completion.chunk" if chat else "text_completion"
        slots = self.slots

        def chunk(text: str | None, finish: str | None, first: bool = False) -> str:
            if chat:
                delta: dict = {} if text is None else {"content": text}
                if first:
                    delta["role"] = "assistant"
                c = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                c = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            return f"data: {json.dumps({**meta, 'object': obj, 'choices': [c]})}\n\n"

        async def events():
            it = iter(job)
            stop = StopMatcher(req.stop)
            done = False
            try:
                if chat:
                    yield chunk("", None, first=True)
                while True:
                    tok = await to_thread.run_sync(next, it, None, abandon_on_cancel=True)
                    if tok is None:
                        break
                    out = stop.feed(tok.text)
                    if out:
                        yield chunk(out, None)
                    if stop.stopped:
                        job.cancel()
                        break
                rest = stop.flush()
                if rest:
                    yield chunk(rest, None)
                finish = "stop" if stop.stopped else (job.finish_reason if job.finish_reason != "cancelled"
                                                      else "stop")
                yield chunk(None, finish)
                if req.include_usage:
                    yield f"data: {json.dumps({**meta, 'object': obj, 'choices': [], 'usage': _usage(job)})}\n\n"
                yield "data: [DONE]\n\n"
                done = True
            except PrismError as e:
                yield f"data: {json.dumps({'error': {'message': str(e), 'type': 'server_error'}})}\n\n"
            finally:
                if not done:
                    job.cancel()  # the client went away: the engine stops at its next token
                await slots.release()

        return _watched(StreamingResponse)(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _watched(base):
    """A streaming response that notices the client going away while it waits for the next token (Starlette
    notices only at the next write under ASGI 2.4), so the request's slot is freed at once."""
    import anyio

    class Watched(base):
        async def __call__(self, scope, receive, send) -> None:
            async with anyio.create_task_group() as tg:
                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()

    return Watched


def _collect(job, stops: list[str]) -> tuple[str, str]:
    stop = StopMatcher(stops)
    parts = []
    for tok in job:
        parts.append(stop.feed(tok.text))
        if stop.stopped:
            job.cancel()
            break
    parts.append(stop.flush())
    finish = "stop" if stop.stopped else ("stop" if job.finish_reason == "cancelled" else job.finish_reason)
    return "".join(parts), finish or "stop"


def _usage(job) -> dict:
    return {"prompt_tokens": job.n_prompt, "completion_tokens": job.n_generated,
            "total_tokens": job.n_prompt + job.n_generated}


def create_app(server: Server):
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    async def http_error(request, exc: HTTPException):
        return _error(exc.status_code, str(exc.detail), kind="invalid_request_error")

    async def internal(request, exc: Exception):
        return _error(500, f"internal error: {type(exc).__name__}: {exc}", kind="server_error")

    routes = [Route("/health", server.health, methods=["GET"]), Route("/v1/models", server.models, methods=["GET"]),
              Route("/v1/completions", server.completions, methods=["POST"]),
              Route("/v1/chat/completions", server.chat, methods=["POST"]),
              Route("/completions", server.completions, methods=["POST"]),
              Route("/chat/completions", server.chat, methods=["POST"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: internal})
