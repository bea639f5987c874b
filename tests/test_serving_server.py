"""The OpenAI-compatible server (kvlesson.serving.server) driven by the official `openai` client, over HTTP on this
machine, every wait bounded.

Most tests run a tiny random model in float64 with a byte tokenizer (tests.helpers.tiny_chat_model): batched logits
equal its logits alone to ~1e-12, so greedy and seeded tokens agree exactly. Two tests run SmolLM2 itself.
  - streamed and whole completions (and chats) equal model.generate alone under greedy, and a seeded sample equals
    the same seed's tokens from model.generate (which the Engine's own tests hold equal to the Engine's);
  - 16 streaming clients at once each get their own tokens;
  - a client that disconnects mid-stream has its request aborted, and every block comes back;
  - stop strings cut the text, JSON-schema and regex output parses, bad requests get OpenAI's 400 (404 for an unknown
    model) naming the field, and the engine never sees them;
  - stopping the server mid-stream ends the stream, and nothing hangs.
"""
import json
import queue
import re
import threading
import time

import httpx
import pytest

from kvlesson.sample import Sampling
from kvlesson.serving import Engine
from kvlesson.serving.server import Server
from tests.helpers import tiny_chat_model

openai = pytest.importorskip("openai", reason="the server's tests drive it with the openai client: "
                                              "pip install -r requirements-test.txt")
TIMEOUT = 30  # seconds: every call a test makes is bounded by it


OPEN = []  # the clients a test made: closed after it (an unclosed client's socket is a ResourceWarning)


def client(server):
    OPEN.append(openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=TIMEOUT))
    return OPEN[-1]


@pytest.fixture(autouse=True)
def close_clients():
    yield
    while OPEN:
        OPEN.pop().close()


@pytest.fixture(scope="module")
def tiny():
    return tiny_chat_model()


@pytest.fixture
def server(tiny):
    with Server(tiny, port=0, name="tiny", n_blocks=64, block_size=4, max_batch_tokens=64) as s:
        yield s
    assert not s.loop.running


def alone(model, text, n, sampling=None):
    ids = model.tokenizer.encode(text)
    out = model.generate(ids, n, sampling=sampling or Sampling())
    return model.tokenizer.decode(out[: out.index(model.tokenizer.eos_id)] if model.tokenizer.eos_id in out else out)


def wait_until(condition, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_models_lists_the_one_model(server):
    assert [m.id for m in client(server).models.list()] == ["tiny"]


def test_greedy_completions_equal_generate_alone_whole_and_streamed(server, tiny):
    c = client(server)
    for prompt in ("Hello", "The cache holds", "x"):
        want = alone(tiny, prompt, 24)
        whole = c.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0)
        streamed = "".join(e.choices[0].text for e in c.completions.create(
            model="tiny", prompt=prompt, max_tokens=24, temperature=0, stream=True))
        assert whole.choices[0].text == streamed == want
        assert whole.usage.prompt_tokens == len(tiny.tokenizer.encode(prompt))


def test_a_chat_is_rendered_with_the_models_template(server, tiny):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    got = client(server).chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
    assert got.choices[0].message.content == alone(tiny, text, 12)
    assert got.usage.prompt_tokens == len(tiny.tokenizer.encode(text))


def test_a_seeded_sample_equals_the_same_seed_anywhere(server, tiny):
    c = client(server)
    kw = dict(model="tiny", prompt="seeded", max_tokens=16, temperature=0.9, top_p=0.95, seed=1234)
    want = alone(tiny, "seeded", 16, Sampling(temperature=0.9, top_p=0.95, seed=1234))
    assert c.completions.create(**kw).choices[0].text == want
    assert "".join(e.choices[0].text for e in c.completions.create(**kw, stream=True)) == want
    assert c.completions.create(**dict(kw, seed=4321)).choices[0].text != want
    eng = Engine(tiny, n_blocks=64, block_size=4)  # the engine's own, with the same seed
    rid = eng.submit(tiny.tokenizer.encode("seeded"), 16, stop_ids=(tiny.tokenizer.eos_id,),
                     sampling=Sampling(temperature=0.9, top_p=0.95, seed=1234))
    out = eng.run()[rid]
    assert tiny.tokenizer.decode([t for t in out if t != tiny.tokenizer.eos_id]) == want


def test_sixteen_concurrent_streaming_clients_each_get_their_own_tokens(server, tiny):
    prompts = [f"client {i}: {'ab' * i}" for i in range(16)]
    got, errors = {}, []

    def ask(i):
        try:
            stream = client(server).completions.create(model="tiny", prompt=prompts[i], max_tokens=20,
                                                       temperature=0, stream=True)
            got[i] = "".join(e.choices[0].text for e in stream)
        except Exception as e:  # reported below, with the others
            errors.append(e)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not errors and len(got) == 16
    assert got == {i: alone(tiny, p, 20) for i, p in enumerate(prompts)}
    assert max(server.engine.stats["step_seqs"]) > 1  # they really shared steps
    wait_until(lambda: server.engine.pool.blocks_free == server.engine.pool.n_blocks)


def test_a_client_that_disconnects_mid_stream_frees_its_blocks(server):
    body = dict(model="tiny", prompt="a long answer", max_tokens=200, temperature=0, stream=True)
    with httpx.Client(timeout=TIMEOUT) as http, http.stream("POST", f"{server.url}/completions", json=body) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # it is streaming
        wait_until(lambda: server.engine.pool.blocks_free < server.engine.pool.n_blocks)
    # the connection is closed: the request must be aborted long before its 200 tokens
    wait_until(lambda: server.engine.pool.blocks_free == server.engine.pool.n_blocks)
    (request,) = server.engine.requests.values()
    assert request.aborted and len(request.tokens) < 200


def test_stop_strings_cut_the_text_and_free_the_blocks(server, tiny):
    full = alone(tiny, "stop here", 40)
    stop = full[10:13]
    cut = full[: full.index(stop)]
    c = client(server)
    got = c.completions.create(model="tiny", prompt="stop here", max_tokens=40, temperature=0, stop=[stop])
    assert got.choices[0].text == cut and got.choices[0].finish_reason == "stop"
    events = list(c.completions.create(model="tiny", prompt="stop here", max_tokens=40, temperature=0, stop=stop,
                                       stream=True))
    assert "".join(e.choices[0].text for e in events) == cut
    wait_until(lambda: server.engine.pool.blocks_free == server.engine.pool.n_blocks)


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


def test_json_schema_and_regex_output_parses(server):
    c = client(server)
    for seed in range(4):
        got = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "who?"}], max_tokens=64,
                                        temperature=1.0, seed=seed, response_format={
                                            "type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}})
        value = json.loads(got.choices[0].message.content)
        assert set(value) == {"name", "age"} and 0 <= value["age"] <= 120 and len(value["name"]) <= 8
        got = c.completions.create(model="tiny", prompt="date:", max_tokens=20, temperature=1.0, seed=seed,
                                   extra_body={"response_format": {"type": "regex", "regex": r"20[0-9]{2}-[01][0-9]"}})
        assert re.fullmatch(r"20[0-9]{2}-[01][0-9]", got.choices[0].text) and got.choices[0].finish_reason == "stop"
    forced = server.engine.stats["forced_tokens"]
    assert forced > 0  # `{"name": "` and the like came without a draw


@pytest.mark.parametrize("change, status, param", [
    (dict(temperature=-0.5), 400, "temperature"),
    (dict(top_p=0), 400, "top_p"),
    (dict(top_p=1.5), 400, "top_p"),
    (dict(model="gpt-4o"), 404, "model"),
    (dict(max_tokens=10**6), 400, "max_tokens"),
    (dict(max_tokens=0), 400, "max_tokens"),
    (dict(n=3), 400, "n"),
    (dict(logit_bias={"5": 10}), 400, "logit_bias"),
    (dict(stop=["a", "b", "c", "d", "e"]), 400, "stop"),
    (dict(seed="x"), 400, "seed"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frob"}}}), 400,
     "response_format"),
    (dict(response_format={"type": "regex", "regex": "(unclosed"}), 400, "response_format"),
    (dict(messages=[{"role": "wizard", "content": "hi"}]), 400, "messages[0].role"),
    (dict(messages=[{"role": "user", "content": "x" * 600}]), 400, "messages"),
    (dict(frobnicate=1), 400, "frobnicate"),
])
def test_bad_requests_get_openais_error_naming_the_field(server, change, status, param):
    body = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    body.update(change)
    r = httpx.post(f"{server.url}/chat/completions", json=body, timeout=TIMEOUT)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]
    assert server.engine.requests == {}  # the engine never saw it


def test_malformed_json_and_a_bad_prompt_are_400(server):
    r = httpx.post(f"{server.url}/completions", content=b"{not json", timeout=TIMEOUT,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "parse the JSON body" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/completions", json=dict(model="tiny", prompt=[5, 999], max_tokens=2),
                   timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    with pytest.raises(openai.BadRequestError) as e:
        client(server).completions.create(model="tiny", prompt="hi", max_tokens=2, temperature=3)
    assert e.value.body["param"] == "temperature"
    assert server.engine.requests == {}


def test_stopping_the_server_mid_stream_ends_the_stream(tiny):
    server = Server(tiny, port=0, name="tiny", n_blocks=64, block_size=4).start()
    body = dict(model="tiny", prompt="on and on", max_tokens=200, temperature=0, stream=True)
    with httpx.Client(timeout=TIMEOUT) as http, http.stream("POST", f"{server.url}/completions", json=body) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        start = time.monotonic()
        server.stop()
        rest = [line for line in lines if line.startswith("data: ")]
    assert time.monotonic() - start < TIMEOUT
    assert rest[-1] == "data: [DONE]" and json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "abort"
    assert server.engine.pool.blocks_free == server.engine.pool.n_blocks


# ---- SmolLM2 itself: few and quick


def test_smollm2_served_equals_generate_alone(model):
    with Server(model, port=0, n_blocks=32) as server:
        c = client(server)
        prompt = "The capital of France is"
        want = model.tokenizer.decode(model.generate(model.tokenizer.encode(prompt), 8))
        assert c.completions.create(model=server.name, prompt=prompt, max_tokens=8, temperature=0
                                    ).choices[0].text == want
        messages = [{"role": "user", "content": "Name a colour."}]
        ids = model.tokenizer.encode(model.chat_prompt("Name a colour."))
        out = model.generate(ids, 12)
        want = model.tokenizer.decode(out[: out.index(2)] if 2 in out else out)
        streamed = "".join(e.choices[0].delta.content or "" for e in c.chat.completions.create(
            model=server.name, messages=messages, max_tokens=12, temperature=0, stream=True))
        assert streamed == want


def test_smollm2_json_output_parses(model):
    with Server(model, port=0, n_blocks=32) as server:
        got = client(server).chat.completions.create(
            model=server.name, messages=[{"role": "user", "content": "Describe a cat as JSON."}], max_tokens=40,
            temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}})
        value = json.loads(got.choices[0].message.content)
        assert set(value) == {"name", "age"}
        assert server.engine.stats["forced_tokens"] >= 3



def test_a_chat_without_max_tokens_runs_to_what_the_pool_holds(server, tiny):
    """OpenAI's chat runs to the end of the context when max_tokens is absent; here the pool (64 blocks of 4) is the
    smaller limit, and the request is served, not refused."""
    got = client(server).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "go on"}],
                                                 temperature=0)
    prompt = got.usage.prompt_tokens
    assert got.usage.completion_tokens <= 64 * 4 - prompt + 1
    assert got.choices[0].finish_reason in ("stop", "length")


def test_the_command_line_serves_smollm2_until_ctrl_c(model, tmp_path):
    """`python -m kvlesson.serving.server --port P`: it prints where it serves, answers, and Ctrl-C stops it."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a port free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # A shell that starts a job in the background without job control (`pytest &` in a script, nohup) starts it with
    # SIGINT ignored, and every process it starts inherits that: this server would never see the test's Ctrl-C. So it
    # starts with SIGINT as a terminal's foreground process has it.
    proc = subprocess.Popen([sys.executable, "-m", "kvlesson.serving.server", "--port", str(port), "--n-blocks", "16"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    said, errors = queue.Queue(), []  # a thread drains each pipe, so every read here can be bounded
    readers = [threading.Thread(target=lambda: [*map(said.put, proc.stdout), said.put("")], daemon=True),
               threading.Thread(target=lambda: errors.extend(proc.stderr), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        lines = [said.get(timeout=TIMEOUT)]
        while "serving" not in lines[-1] and lines[-1] and len(lines) < 5:  # a first load says what it does first
            lines.append(said.get(timeout=TIMEOUT))
        assert f"http://127.0.0.1:{port}/v1" in lines[-1], "".join(lines)
        got = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=TIMEOUT).json()
        assert got["data"][0]["id"] == "SmolLM2-135M-Instruct"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()  # no server outlives its test
            proc.wait()
        for reader, pipe in zip(readers, (proc.stdout, proc.stderr), strict=True):
            reader.join(TIMEOUT)
            pipe.close()
    assert proc.returncode == 0, f"after Ctrl-C the server ended with {proc.returncode} (-9: still running after " \
        f"{TIMEOUT} s, killed):\n{''.join(errors)}"
