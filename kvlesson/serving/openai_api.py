"""The OpenAI API's request and response bodies: what a client may ask for, checked field by field, and what it gets.

    ask = parse(body, chat=True, model_name="SmolLM2-135M-Instruct")   # APIError for anything OpenAI would refuse
    chunk(ask, "cmpl-1", text="Hello")                                  # one server-sent event's JSON

Everything a request may carry is checked here, before anything reaches the engine, and a refusal is what OpenAI's API
answers (its documented error object): HTTP 400 with {"error": {"message", "type": "invalid_request_error", "param":
the field, "code"}}, or 404 with code "model_not_found" for a model this server does not serve. The fields OpenAI
documents that this server cannot honour (n > 1, logprobs, echo, suffix, penalties other than 0, logit_bias) are
refused by name rather than ignored: a client that asked for them would otherwise read an answer to another question.
Beyond OpenAI's fields, as vLLM and SGLang accept them: top_k, min_p, repetition_penalty, and a response_format of
{"type": "regex", "regex": "..."}.
"""
import json
import math
import numbers
import time
from dataclasses import dataclass, field

from kvlesson.sample import Sampling

__all__ = ["APIError", "Ask", "parse", "render_chat", "completion", "chunk", "models"]

DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions; a chat may run to the end of the context


class APIError(Exception):
    """A request refused as OpenAI refuses it: an HTTP status and OpenAI's error object."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": "invalid_request_error", "param": self.param,
                          "code": self.code}}


@dataclass
class Ask:
    """One request, checked: what to generate, how, and how to answer."""

    chat: bool
    model: str
    prompt: str | list = ""  # completions: text or token ids
    messages: list = field(default_factory=list)  # chat: [{"role", "content"}]
    max_tokens: int | None = None  # None: the default (DEFAULT_MAX_TOKENS, or the rest of the context for a chat)
    sampling: Sampling = field(default_factory=Sampling)
    stop: tuple = ()
    stream: bool = False
    include_usage: bool = False
    response_format: dict | None = None  # {"type": "json_schema" | "json_object" | "regex", ...}, or None for text


COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop", "seed", "user",
          "top_k", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias", "logprobs",
          "response_format"}
FIELDS = {False: COMMON | {"prompt", "echo", "suffix", "best_of"},
          True: COMMON | {"messages", "max_completion_tokens", "top_logprobs"}}
ROLES = ("system", "user", "assistant")


def parse(body: bytes, *, chat: bool, model_name: str) -> Ask:
    """A request body (bytes) -> Ask, or APIError naming the first field OpenAI would refuse."""
    try:
        got = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise APIError("We could not parse the JSON body of your request. The body must be a JSON object.") from None
    if not isinstance(got, dict):
        raise APIError("The body of your request must be a JSON object.")
    for name in got:
        if name not in FIELDS[chat]:
            raise APIError(f"Unrecognized request argument supplied: {name}", name)
    model = _required(got, "model", str)
    if model != model_name:
        raise APIError(f"The model `{model}` does not exist; this server serves `{model_name}`.", "model", 404,
                       "model_not_found")
    ask = Ask(chat, model)
    if chat:
        ask.messages = _messages(_required(got, "messages", list))
    else:
        ask.prompt = _prompt(_required(got, "prompt", (str, list)))
    limit = "max_completion_tokens" if got.get("max_completion_tokens") is not None else "max_tokens"
    ask.max_tokens = _integer(got, limit, minimum=1)
    ask.sampling = _sampling(got)
    ask.stop = _stop(got.get("stop"))
    ask.stream = _boolean(got, "stream")
    options = _optional(got, "stream_options", dict) or {}
    if options and not ask.stream:
        raise APIError("stream_options is only allowed when stream is true.", "stream_options")
    ask.include_usage = _boolean(options, "include_usage", "stream_options.include_usage")
    ask.response_format = _response_format(got.get("response_format"))
    _unsupported(got, chat)
    return ask


def _required(got, name, kinds):
    if got.get(name) is None:
        raise APIError(f"Missing required parameter: '{name}'.", name)
    return _optional(got, name, kinds)


def _optional(got, name, kinds, param=None):
    value = got.get(name)
    if value is not None and not isinstance(value, kinds):
        want = " or ".join(k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,)))
        raise APIError(f"Invalid type for '{param or name}': expected {want}, got {type(value).__name__}.",
                       param or name)
    return value


def _boolean(got, name, param=None):
    return bool(_optional(got, name, bool, param))


def _number(got, name, low, high, *, low_open=False):
    """A real number in [low, high] ((low, high] with low_open), or None when absent."""
    value = got.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise APIError(f"Invalid type for '{name}': expected a number, got {json.dumps(value)}.", name)
    if value < low or value > high or (low_open and value == low):
        bounds = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise APIError(f"'{name}' must lie in {bounds}; got {value}.", name)
    return float(value)


def _integer(got, name, minimum=None, maximum=None):
    value = got.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(f"Invalid type for '{name}': expected an integer, got {json.dumps(value)}.", name)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise APIError(f"'{name}' must be at least {minimum}" + (f" and at most {maximum}" if maximum else "") +
                       f"; got {value}.", name)
    return value


def _messages(messages):
    if not messages:
        raise APIError("'messages' must hold at least one message.", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise APIError(f"{where} must be an object whose role is one of {', '.join(ROLES)}.", f"{where}.role")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise APIError(f"{where}.content: only text parts are supported.", f"{where}.content")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise APIError(f"{where}.content must be a string.", f"{where}.content")
        out.append({"role": m["role"], "content": content})
    return out


def _prompt(prompt):
    if isinstance(prompt, str):
        return prompt
    if len(prompt) == 1 and isinstance(prompt[0], (str, list)):  # a batch of one prompt
        return _prompt(prompt[0])
    if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        raise APIError("'prompt' must be a string, or a non-empty list of token ids (one prompt per request).",
                       "prompt")
    return list(prompt)


def _sampling(got):
    """The sampler's parameters: OpenAI's defaults (temperature 1, top_p 1), the extensions' off."""
    temperature = _number(got, "temperature", 0, 2)
    top_p = _number(got, "top_p", 0, 1, low_open=True)
    min_p = _number(got, "min_p", 0, 1)
    penalty = _number(got, "repetition_penalty", 0, math.inf, low_open=True)
    return Sampling(temperature=1.0 if temperature is None else temperature, top_p=1.0 if top_p is None else top_p,
                    top_k=_integer(got, "top_k", minimum=0) or 0, min_p=min_p or 0.0,
                    repetition_penalty=1.0 if penalty is None else penalty,
                    seed=_integer(got, "seed", minimum=-(2**63), maximum=2**63 - 1))


def _stop(stop):
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise APIError("'stop' must be a non-empty string or a list of at most 4 of them.", "stop")
    return tuple(stops)


def _response_format(fmt):
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_schema", "schema": {"type": "object"}}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise APIError("response_format.json_schema must be an object with a 'schema' object.",
                           "response_format.json_schema")
        return {"type": "json_schema", "schema": spec.get("schema", {})}
    if kind == "regex":
        if not isinstance(fmt.get("regex"), str):
            raise APIError("response_format.regex must be a string.", "response_format.regex")
        return {"type": "regex", "regex": fmt["regex"]}
    raise APIError("response_format.type must be one of text, json_object, json_schema, regex.",
                   "response_format.type")


def _unsupported(got, chat):
    """OpenAI's fields this server cannot honour, refused by name unless they ask for the default."""
    defaults = {"n": 1, "best_of": 1, "echo": False, "logprobs": None if not chat else False, "suffix": None,
                "frequency_penalty": 0, "presence_penalty": 0, "logit_bias": None, "top_logprobs": None}
    for name, default in defaults.items():
        value = got.get(name)
        if name in got and value not in (default, None) and value != {}:
            raise APIError(f"'{name}' = {json.dumps(value)} is not supported by this server (only {default}).", name)
    _optional(got, "user", str)


def render_chat(template: str, messages: list[dict]) -> str:
    """The model's own chat template (Jinja, from the GGUF file) applied to the messages, with the assistant's turn
    opened: rendered as Hugging Face transformers renders it (jinja2's sandbox, trim_blocks and lstrip_blocks), since
    that is how the template's authors ran it. APIError naming `messages` if the template refuses them."""
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=True)
    except TemplateError as e:
        raise APIError(f"The chat template refused these messages: {e}", "messages") from None


# ---- what the client receives


def _envelope(ask: Ask, rid: str, kind: str) -> dict:
    return {"id": rid, "object": kind, "created": int(time.time()), "model": ask.model}


def completion(ask: Ask, rid: str, text: str, finish_reason: str, usage: dict) -> dict:
    """The whole answer, for a request that did not stream."""
    out = _envelope(ask, rid, "chat.completion" if ask.chat else "text_completion")
    choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None} if ask.chat else
              {"index": 0, "text": text, "logprobs": None})
    return dict(out, choices=[dict(choice, finish_reason=finish_reason)], usage=usage)


def chunk(ask: Ask, rid: str, text: str = "", finish_reason: str | None = None, usage: dict | None = None,
          first: bool = False) -> dict:
    """One event of a stream: new text, or the finish reason, or (with stream_options.include_usage) the usage, whose
    event has no choices. A chat stream's first event carries the assistant's role."""
    out = _envelope(ask, rid, "chat.completion.chunk" if ask.chat else "text_completion")
    if usage is not None:
        return dict(out, choices=[], usage=usage)
    delta = dict({"role": "assistant"} if first else {}, **({"content": text} if text or first else {}))
    choice = {"index": 0, "delta": delta} if ask.chat else {"index": 0, "text": text, "logprobs": None}
    return dict(out, choices=[dict(choice, finish_reason=finish_reason)])


def models(model_name: str, created: int) -> dict:
    return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                        "owned_by": "kvlesson"}]}
