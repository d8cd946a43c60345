#!/usr/bin/env python3
"""Time to first token of a chat's later turns with and without `serve --prefix-cache-mb` (issue 27).

  python3 bench/prefix_cache.py BUILD_DIR MODEL_DIR ROUNDS [SERVE ARGS...]

A 3-turn chat as token ids on /v1/completions (streamed, greedy): turn 1 sends a
400-token history, each later turn sends the turn before's prompt plus 20 new tokens;
every turn generates 20. (The answers are left out of the next prompt, so only the
earlier prompt can come from the cache: the smaller saving.) The servers with the cache off and on run one after the other
(never together), alternating first in each round; each round is a fresh chat whose ids
are seeded by the round. Prints per round and the medians as JSON lines, and checks
that every turn's tokens are the same with the cache on and off.
"""
import json, os, random, re, statistics, subprocess, sys, tempfile, time, urllib.request

from serve_util import start_serve

build, model, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
serve_args = sys.argv[4:]
bin_ = os.path.join(build, "bin", "tessera")
vocab = json.load(open(os.path.join(model, "config.json")))["vocab_size"]
HISTORY, NEW, GEN, TURNS = 400, 20, 20, 3


class Serve:
    def __init__(self, *args):
        self.p, self.port, self.log = start_serve([bin_, "serve", "--model", model, "--port", "0", "--ctx-size", "1024", *args], "tessera-prefix-")

    def stream(self, ids):
        """Seconds to the first token, and the generated ids."""
        body = {"prompt": ids, "max_tokens": GEN, "temperature": 0, "stream": True}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        ttft, out = None, []
        with urllib.request.urlopen(req, timeout=600) as r:
            for line in r:
                line = line.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[5:])
                if not ev.get("choices"):
                    continue
                if ttft is None:
                    ttft = time.perf_counter() - t0
                out.append(ev["choices"][0].get("text"))
        return ttft, out

    def metrics(self):
        return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30).read().decode()

    def close(self):
        self.p.terminate()
        self.p.wait()


def chat(server, seed):
    rng = random.Random(seed)
    ids = [rng.randrange(1, vocab) for _ in range(HISTORY)]
    ttfts, outs = [], []
    for turn in range(TURNS):
        ttft, out = server.stream(ids)
        ttfts.append(ttft)
        outs.append(out)
        ids = ids + [rng.randrange(1, vocab) for _ in range(NEW)]
    return ttfts, outs


results = {"off": [], "on": []}
same = True
for r in range(rounds):
    order = ["off", "on"] if r % 2 == 0 else ["on", "off"]
    got = {}
    for mode in order:
        s = Serve(*serve_args, *(["--prefix-cache-mb", "512"] if mode == "on" else []))
        try:
            chat(s, 1000 + r)  # warm-up chat: page the weights in, JIT the kernels
            ttfts, outs = chat(s, r)
            got[mode] = outs
            results[mode].append(ttfts)
            hits = [l for l in s.metrics().splitlines() if l.startswith("tessera_prefix_cache_hits_total")]
        finally:
            s.close()
        print(json.dumps({"round": r, "mode": mode, "ttft_s": ttfts, "metrics": hits}), flush=True)
    same = same and got["off"] == got["on"]

summary = {"turn": [], "same_tokens": same}
for t in range(TURNS):
    off = statistics.median(x[t] for x in results["off"])
    on = statistics.median(x[t] for x in results["on"])
    summary["turn"].append({"turn": t + 1, "ttft_off_s": off, "ttft_on_s": on, "ratio": on / off})
print(json.dumps(summary))
