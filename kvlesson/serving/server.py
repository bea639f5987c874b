"""An OpenAI-compatible server over the Engine: the edge where a serving engine meets its users (lesson 16).

    python -m kvlesson.serving.server [--host 127.0.0.1] [--port 8000]    # SmolLM2, until Ctrl-C

    with Server(model, port=0) as server:                                  # from a notebook: threads of its own
        client = openai.OpenAI(base_url=server.url, api_key="none")
        client.chat.completions.create(model=server.name, messages=[...], stream=True)

Endpoints, as OpenAI's API has them: GET /v1/models, POST /v1/completions and POST /v1/chat/completions, each
answering whole or, with "stream": true, as server-sent events (`data: {json}` per event, then `data: [DONE]`).

Three threads of control, and one rule that keeps them simple: only the engine loop's thread touches the engine.
  - uvicorn runs the ASGI app (Starlette) on an asyncio event loop in a thread of its own. A request is parsed and
    checked there (kvlesson.serving.openai_api: a bad field is an HTTP 400 naming it, and the engine never sees it),
    its prompt rendered with the model's own chat template and tokenized;
  - the engine loop (kvlesson.serving.loop.EngineLoop) takes it between two steps, runs steps, and hands each request
    its text through the event loop's call_soon_threadsafe;
  - the caller's thread (a notebook's, or the command line's) starts and stops both.
A client that goes away mid-answer is noticed as it happens (the ASGI receive channel says http.disconnect) and its
request is aborted at the next boundary between steps: its blocks go back to the pool at once, not when an answer
nobody reads would have ended.
"""
import argparse
import asyncio
import json
import socket
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvlesson.serving import openai_api
from kvlesson.serving.engine import Engine
from kvlesson.serving.grammar import Grammar
from kvlesson.serving.loop import EngineLoop
from kvlesson.serving.openai_api import APIError

if TYPE_CHECKING:  # a name for the annotation only: kvlesson.llama imports kvlesson.serving
    from kvlesson.llama import Model

__all__ = ["Server", "main", "NAME"]

NAME = "SmolLM2-135M-Instruct"


class Server:
    """The engine loop and the HTTP server, started and stopped together (a context manager, or start() and stop())."""

    def __init__(self, model: "Model", *, host: str = "127.0.0.1", port: int = 8000, name: str = NAME,
                 n_blocks: int = 256,
                 block_size: int = 16, max_batch_tokens: int = 256, max_seqs: int | None = None,
                 prefix_caching: bool = True):
        """model: kvlesson.llama.load() (or any Model with a tokenizer and a chat template); port 0 takes a free
        one. The rest configures the Engine (lesson 13); 256 blocks of 16 hold 4,096 positions."""
        self.model, self.name, self.host = model, name, host
        self.engine = Engine(model, n_blocks, block_size, max_batch_tokens, max_seqs, prefix_caching)
        self.loop = EngineLoop(self.engine, model.tokenizer.decode)
        self.socket = socket.create_server((host, port))
        self.port = self.socket.getsockname()[1]
        self.started = int(time.time())
        self.app = self._app()
        self._uvicorn = self._thread = None

    @property
    def url(self) -> str:
        """Where a client points its base_url."""
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout: float = 30.0) -> "Server":
        import uvicorn

        self.loop.start()
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=5)
        self._uvicorn = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._uvicorn.run, kwargs=dict(sockets=[self.socket]),
                                        name="kvlesson-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the HTTP server did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Every open request ends ("abort"), then the HTTP server shuts down. Safe to call twice."""
        if self.loop.running:
            self.loop.stop(timeout)
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise RuntimeError(f"the HTTP server did not stop within {timeout} s")
        self.socket.close()

    def __enter__(self):
        return self.start() if self._thread is None else self

    def __exit__(self, *exc):
        self.stop()

    # ---- the ASGI app

    def _app(self):
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        async def models(request):
            return JSONResponse(openai_api.models(self.name, self.started))

        async def completions(request):
            return await self._answer(request, chat=False)

        async def chat(request):
            return await self._answer(request, chat=True)

        return Starlette(routes=[Route("/v1/models", models, methods=["GET"]),
                                 Route("/v1/completions", completions, methods=["POST"]),
                                 Route("/v1/chat/completions", chat, methods=["POST"])])

    async def _answer(self, request, chat):
        from starlette.responses import JSONResponse

        try:
            ask = openai_api.parse(await request.body(), chat=chat, model_name=self.name)
            job = self.job(ask)
        except APIError as e:
            return JSONResponse(e.body(), status_code=e.status)
        return Answer(self.loop, ask, job)

    def job(self, ask: openai_api.Ask) -> dict:
        """What the engine loop needs for a checked request: token ids, max_new_tokens, stops, sampling, grammar.
        APIError for a prompt or a length the model or the pool cannot take, or a format the grammar library refuses."""
        tok, cfg = self.model.tokenizer, self.model.config
        where = "messages" if ask.chat else "prompt"
        if ask.chat:
            ids = tok.encode(openai_api.render_chat(self.model.chat_template, ask.messages))
        elif isinstance(ask.prompt, str):
            ids = tok.encode(ask.prompt)
        else:
            ids = ask.prompt
            bad = [t for t in ids if not 0 <= t < cfg.vocab]
            if bad:
                raise APIError(f"'prompt' holds token ids outside the vocabulary [0, {cfg.vocab}): {bad[:5]}", where)
        if not ids:
            raise APIError(f"'{where}' is empty: at least one token is needed to predict the next", where)
        room = cfg.max_len - len(ids)
        pool = self.engine.pool.n_blocks * self.engine.pool.block_size - len(ids) + 1  # the last token is never cached
        n = ask.max_tokens or (max(min(room, pool), 1) if ask.chat else openai_api.DEFAULT_MAX_TOKENS)
        if n > room:
            raise APIError(f"This model's maximum context length is {cfg.max_len} tokens. However, you requested "
                           f"{len(ids) + n} tokens ({len(ids)} in the {where}, {n} in the completion).",
                           "max_tokens" if room > 0 else where, code="context_length_exceeded")
        try:
            self.engine.check(ids, n)  # reads only the pool's fixed size: safe beside the loop's thread
        except ValueError as e:
            raise APIError(f"The server's pool cannot hold this request: {e}", "max_tokens") from None
        fmt, grammar = ask.response_format, None
        try:
            if fmt is not None and fmt["type"] == "regex":
                grammar = Grammar.regex(tok, fmt["regex"])
            elif fmt is not None:
                grammar = Grammar.json_schema(tok, fmt["schema"])
        except ValueError as e:
            raise APIError(str(e), "response_format") from None
        return dict(ids=ids, max_new_tokens=n, stop_ids=(tok.eos_id,), stops=ask.stop, sampling=ask.sampling,
                    grammar=grammar)


class Answer:
    """The ASGI response for one request: it submits the request to the engine loop, sends what comes back (whole,
    or event by event), and aborts the request if the client goes away first."""

    def __init__(self, loop: EngineLoop, ask: openai_api.Ask, job: dict):
        self.loop, self.ask, self.job = loop, ask, job

    async def __call__(self, scope, receive, send):
        events, here = asyncio.Queue(), asyncio.get_running_loop()

        def on_event(kind, **details):  # called on the engine loop's thread
            here.call_soon_threadsafe(events.put_nowait, (kind, details))

        try:
            ticket = self.loop.submit(on_event=on_event, **self.job)
        except RuntimeError:  # the loop has stopped: the server is shutting down
            return await _json(send, 503, APIError("The server is shutting down.", status=503).body())
        gone = asyncio.ensure_future(_disconnect(receive))
        rid = f"{'chatcmpl' if self.ask.chat else 'cmpl'}-{ticket.number}"
        try:
            if self.ask.stream:
                await self._stream(send, rid, events, gone)
            else:
                await self._whole(send, rid, events, gone)
        except OSError:
            pass  # the client went away while we were writing: the finally below aborts its request
        finally:
            gone.cancel()
            if not ticket.ended:
                self.loop.abort(ticket)

    async def _whole(self, send, rid, events, gone):
        text = []
        while (event := await _next(events, gone)) is not None:
            kind, details = event
            if kind == "text":
                text.append(details["text"])
                continue
            reason = details["finish_reason"]
            if reason == "error":
                return await _json(send, 400, APIError(details["message"]).body())
            if reason == "abort":
                return await _json(send, 503, APIError("The request was aborted: the server is shutting down.",
                                                       status=503).body())
            return await _json(send, 200, openai_api.completion(self.ask, rid, "".join(text), reason,
                                                                details["usage"]))

    async def _stream(self, send, rid, events, gone):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                (b"cache-control", b"no-cache")]})
        if self.ask.chat:
            await _event(send, openai_api.chunk(self.ask, rid, first=True))
        while (event := await _next(events, gone)) is not None:
            kind, details = event
            if kind == "text":
                await _event(send, openai_api.chunk(self.ask, rid, text=details["text"]))
                continue
            if details["finish_reason"] == "error":
                await _event(send, APIError(details["message"]).body())
            else:
                await _event(send, openai_api.chunk(self.ask, rid, finish_reason=details["finish_reason"]))
                if self.ask.include_usage:
                    await _event(send, openai_api.chunk(self.ask, rid, usage=details["usage"]))
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
            return


async def _next(events, gone):
    """The next event of a request -> (kind, details), or None once the client has gone away."""
    get = asyncio.ensure_future(events.get())
    done, _ = await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
    if get in done:
        return get.result()
    get.cancel()
    return None


async def _disconnect(receive):
    """Returns when the client disconnects (its request body has been read already, so nothing else arrives)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _event(send, payload):
    body = b"data: " + json.dumps(payload).encode() + b"\n\n"
    await send({"type": "http.response.body", "body": body, "more_body": True})


async def _json(send, status, payload):
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvlesson.serving.server", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="the port to listen on (default: 8000)")
    parser.add_argument("--n-blocks", type=int, default=256, help="blocks in the KV pool (default: 256)")
    parser.add_argument("--block-size", type=int, default=16, help="positions per block (default: 16)")
    parser.add_argument("--max-batch-tokens", type=int, default=256, help="tokens per step (default: 256)")
    args = parser.parse_args(argv)
    from kvlesson import llama  # the core's model loader; imported here, since llama itself imports serving

    server = Server(llama.load(), host=args.host, port=args.port, n_blocks=args.n_blocks,
                    block_size=args.block_size, max_batch_tokens=args.max_batch_tokens).start()
    print(f"kvlesson: serving {server.name} at {server.url} (Ctrl-C stops it)", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
