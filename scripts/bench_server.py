"""Lesson 16's clocks over several rounds: the server edge seen from the client and from the engine.

    python scripts/bench_server.py [--rounds 5] [--clients 6] [--rate 4] [--tokens 10] [--threads 2]

Each round, on SmolLM2 behind kvlesson.serving.server.Server (a free port of 127.0.0.1):
  - chat: a two-turn chat (the second turn holds the first), on a server with prefix caching and one without; the
    second turn's time to first token (TTFT) at the client and in the engine;
  - load: `clients` streaming clients arriving as a seeded Poisson process of `rate` per second, `tokens` new tokens
    each; TTFT at the client and in the engine, and the time between tokens: each client's mean gap against the
    engine's time per output token for that request (medians over the clients);
  - mask: a grammar's token mask (llguidance) for every step of a JSON answer, against that step count;
  - jump-forward: the steps one JSON answer takes with forced tokens chunked, and one a step (exact counts).
After one warm-up round, it prints the median and the min .. max over rounds, and names a round whose numbers
stalled (bench.rounds_table), leaving it out.
"""
import argparse
import json
import os
import statistics
import threading
import time
import urllib.request

import numpy as np
from bench import rounds_table, spread

from kvlesson import llama
from kvlesson.serving import Engine
from kvlesson.serving.grammar import Grammar
from kvlesson.serving.server import Server

SCHEMA = {"type": "object", "properties": {"river": {"type": "string", "maxLength": 20},
                                           "length_km": {"type": "integer"}},
          "required": ["river", "length_km"], "additionalProperties": False}


def stream(port, path, body):
    """POST a streaming request -> (its text, seconds from sending to each piece of text)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(dict(body, stream=True)).encode(),
                                     {"Content-Type": "application/json"})
    start, text, times = time.perf_counter(), [], []
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            if line.startswith(b"data: {"):
                choice = json.loads(line[6:])["choices"]
                piece = choice and (choice[0].get("text") or choice[0].get("delta", {}).get("content"))
                if piece:
                    text.append(piece)
                    times.append(time.perf_counter() - start)
    return "".join(text), times


def chat_round(model, caching):
    """-> (turn 2's TTFT at the client, in the engine, its prompt tokens, those found in the prefix cache): lesson 16's
    chat, the model's own first answer carried into the second turn."""
    with Server(model, port=0, n_blocks=64, prefix_caching=caching) as s:
        turn1 = [{"role": "user", "content": "Name three rivers in Europe."}]
        ask = {"model": s.name, "temperature": 0, "max_tokens": 16}
        first, _ = stream(s.port, "/v1/chat/completions", dict(ask, messages=turn1))
        turn2 = turn1 + [{"role": "assistant", "content": first}, {"role": "user", "content": "Which is longest?"}]
        client = stream(s.port, "/v1/chat/completions", dict(ask, messages=turn2, max_tokens=4))[1][0]
        engine = s.loop.stats()["requests"][1]
        return client, engine["ttft_s"], engine["prompt"], engine["prefix_hit_tokens"]


def load_round(model, clients, rate, tokens, seed):
    with Server(model, port=0, n_blocks=128) as s:
        arrivals = np.cumsum(np.random.default_rng(seed).exponential(1 / rate, clients))  # [clients] seconds
        times = {}

        def client(i):
            time.sleep(arrivals[i])
            times[i] = stream(s.port, "/v1/completions", {"model": s.name, "prompt": f"Client {i} asks:",
                                                          "max_tokens": tokens, "temperature": 0})[1]

        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        stats = s.loop.stats()["requests"].values()
        return dict(client_ttft=statistics.median(ts[0] for ts in times.values()),
                    engine_ttft=statistics.median(r["ttft_s"] for r in stats),
                    client_tbt=statistics.median(float(np.diff(ts).mean()) for ts in times.values()),
                    engine_tpot=statistics.median(r["tpot_s"] for r in stats))


def mask_round(model):
    g, costs = Grammar.json_schema(model.tokenizer, SCHEMA), []
    for t in model.tokenizer.encode('{"river": "Volga", "length_km": 3531}'):
        start = time.perf_counter()
        g.allowed(model.config.vocab)
        costs.append(time.perf_counter() - start)
        g.accept([t])
    return statistics.median(costs), max(costs)


def jump_forward(model):
    """-> (tokens, forced, steps one a step, steps chunked) for one greedy JSON answer."""
    ids = model.tokenizer.encode(model.chat_prompt("The longest river in Europe, as JSON."))
    out = {}
    for jump in (False, True):
        eng = Engine(model, n_blocks=16, jump_forward=jump)
        rid = eng.submit(ids, 30, stop_ids=(model.tokenizer.eos_id,), grammar=Grammar.json_schema(model.tokenizer,
                                                                                                   SCHEMA))
        out[jump] = (eng.run()[rid], eng.stats)
    (slow, s_slow), (fast, s_fast) = out[False], out[True]
    assert slow == fast
    return len(fast), s_fast["forced_tokens"], s_slow["steps"], s_fast["steps"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--rate", type=float, default=4.0, help="client arrivals per second")
    ap.add_argument("--tokens", type=int, default=10, help="new tokens per client")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for numpy's BLAS")
    args = ap.parse_args(argv)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(args.threads):  # only while it measures: a caller (the tests) keeps its own setting
        run(args)


def run(args):
    model = llama.load()
    chat_round(model, True), load_round(model, 2, args.rate, 2, seed=99), mask_round(model)  # warm-up, not timed
    rows, hits = [], {}
    for r in range(args.rounds):
        row = {}
        for caching in (True, False):
            row[f"chat_client_{caching}"], row[f"chat_engine_{caching}"], prompt, hits[caching] = chat_round(model,
                                                                                                          caching)
        row.update(load_round(model, args.clients, args.rate, args.tokens, seed=r))
        row["mask"], row["mask_max"] = mask_round(model)
        rows.append(row)
    names = list(rows[0])
    _, stalled = rounds_table(rows, [n for n in names if n != "mask_max"])  # a maximum is a spike by definition
    kept = [row for i, row in enumerate(rows) if i not in stalled] or rows
    med = {n: statistics.median(row[n] for row in kept) for n in names}
    print(f"{args.rounds} rounds after a warm-up, {args.threads} BLAS threads, load average {os.getloadavg()[0]:.1f}; "
          f"median (min .. max) over the rounds" + (f"; stalled, left out: rounds {stalled}" if stalled else ""))
    labels = {"chat_client_True": "chat turn 2 TTFT, client, caching on (ms)",
              "chat_engine_True": "chat turn 2 TTFT, engine, caching on (ms)",
              "chat_client_False": "chat turn 2 TTFT, client, caching off (ms)",
              "chat_engine_False": "chat turn 2 TTFT, engine, caching off (ms)",
              "client_ttft": f"{args.clients} clients: TTFT, client, median (ms)",
              "engine_ttft": f"{args.clients} clients: TTFT, engine, median (ms)",
              "client_tbt": f"{args.clients} clients: time between tokens, client's mean gap, median (ms)",
              "engine_tpot": f"{args.clients} clients: time per output token, engine, median (ms)",
              "mask": "grammar mask per step, median (us)", "mask_max": "grammar mask per step, max (us)"}
    for name in names:
        scale = 1e6 if name.startswith("mask") else 1e3
        values = [row[name] * scale for row in kept]
        print(f"| {labels[name]} | {med[name] * scale:.2f} | {spread(values)} |")
    print(f"chat turn 2: {prompt} prompt tokens, {hits[True]} found in the prefix cache with caching on, "
          f"{hits[False]} without")
    tokens, forced, slow, fast = jump_forward(model)
    print(f"jump-forward: {tokens} tokens, {forced} forced; {slow} steps one a step, {fast} chunked, "
          f"{slow - fast} saved")


if __name__ == "__main__":
    main()
