#!/usr/bin/env python3
"""How long a long prompt stalls the streams already decoding: `serve --max-batch B` with
`--prefill-chunk C` against `--prefill-chunk 0` (the prompt prefilled whole).

  python3 bench/prefill_stall.py BUILD_DIR MODEL_DIR ROUNDS CHUNK [SERVE ARGS...]

In each round, 3 greedy streams (/v1/completions, stream: true, 16-token prompts, 64 new
tokens) start together; when each has streamed 8 tokens, a 4th request sends a LONG-token
prompt (TESSERA_STALL_LONG, default 768) for 8 tokens. Figures per server: the longest gap
between two tokens of the 3 streams (the stall), and the long request's time to its first
token. Both servers start once with --max-batch 4 and take the same clients one after the
other, alternating which goes first; the script checks that both give every request the
same tokens. Prints each round and the medians as JSON lines.
"""
import json, os, random, statistics, sys, threading, time, urllib.request

from serve_util import start_serve

build, model, rounds, chunk = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
serve_args = sys.argv[5:]
bin_ = os.path.join(build, "bin", "tessera")
config = os.path.join(model, "config.json")
vocab = json.load(open(config))["vocab_size"] if os.path.isdir(model) else 30000
SHORT, NEW, LONG, LONG_NEW, STREAMS = 16, 64, int(os.environ.get("TESSERA_STALL_LONG", "768")), 8, 3


class Serve:
    def __init__(self, *args):
        self.p, self.port, self.log = start_serve([bin_, "serve", "--model", model, "--port", "0", "--ctx-size", "1024",
                                                  "--max-batch", "4", *args], "tessera-stall-")

    def stream(self, ids, new, on_token):
        """Streams a greedy completion; on_token(count) after each token; returns (token ids, token times)."""
        body = {"prompt": ids, "max_tokens": new, "temperature": 0, "stream": True}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        tokens, times = [], []
        with urllib.request.urlopen(req, timeout=3600) as r:
            for line in r:
                line = line.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                got = json.loads(line[6:])["choices"][0].get("token_ids") or []
                for t in got:
                    tokens.append(t)
                    times.append(time.perf_counter())
                    on_token(len(tokens))
        return tokens, times

    def stop(self):
        self.p.terminate()
        self.p.wait(timeout=120)


def run(server, shorts, long_ids):
    """The streams' longest gap between two tokens (ms), the long request's TTFT (ms), every request's tokens."""
    out = [None] * (STREAMS + 1)
    started = threading.Semaphore(0)
    def short(i):
        fired = [False]
        def on(n):
            if n == 8 and not fired[0]:
                fired[0] = True
                started.release()
        out[i] = server.stream(shorts[i], NEW, on)
    long_t0 = [0.0]
    def long_():
        for _ in range(STREAMS):
            started.acquire()
        long_t0[0] = time.perf_counter()
        out[STREAMS] = server.stream(long_ids, LONG_NEW, lambda n: None)
    threads = [threading.Thread(target=short, args=(i,)) for i in range(STREAMS)] + [threading.Thread(target=long_)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any(o is None for o in out):
        raise RuntimeError("a request failed")
    gap = max(b - a for _, times in out[:STREAMS] for a, b in zip(times, times[1:]))
    return 1e3 * gap, 1e3 * (out[STREAMS][1][0] - long_t0[0]), [o[0] for o in out]


whole = Serve("--prefill-chunk", "0", *serve_args)
chunked = Serve("--prefill-chunk", str(chunk), *serve_args)
try:
    warm = [random.Random(-1).randrange(vocab) for _ in range(SHORT)]
    for s in (whole, chunked):
        s.stream(warm, 4, lambda n: None)
    rows = []
    for r in range(rounds):
        rng = random.Random(r)
        shorts = [[rng.randrange(vocab) for _ in range(SHORT)] for _ in range(STREAMS)]
        long_ids = [rng.randrange(vocab) for _ in range(LONG)]
        order = [("whole", whole), ("chunked", chunked)] if r % 2 == 0 else [("chunked", chunked), ("whole", whole)]
        got = {}
        for name, s in order:
            got[name] = run(s, shorts, long_ids)
        same = got["whole"][2] == got["chunked"][2]
        row = {"round": r, "stall_ms_whole": round(got["whole"][0], 1), "stall_ms_chunked": round(got["chunked"][0], 1),
               "long_ttft_ms_whole": round(got["whole"][1], 1), "long_ttft_ms_chunked": round(got["chunked"][1], 1),
               "same_tokens": same}
        print(json.dumps(row), flush=True)
        rows.append(row)
        if not same:
            raise RuntimeError("the chunked server gave other tokens")
    med = lambda k: round(statistics.median(x[k] for x in rows), 1)
    print(json.dumps({"median_stall_ms_whole": med("stall_ms_whole"), "median_stall_ms_chunked": med("stall_ms_chunked"),
                      "median_long_ttft_ms_whole": med("long_ttft_ms_whole"),
                      "median_long_ttft_ms_chunked": med("long_ttft_ms_chunked"), "chunk": chunk, "rounds": rounds}))
finally:
    whole.stop()
    chunked.stop()
