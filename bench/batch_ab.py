#!/usr/bin/env python3
"""Aggregate tokens/s of two `serve` configurations under the same concurrent load, in alternating rounds.

  python3 bench/batch_ab.py BUILD_DIR MODEL ROUNDS STREAMS --a "SERVE ARGS" --b "SERVE ARGS" [--build-b DIR]

STREAMS clients at once, each a greedy /v1/completions of a 16-token prompt (token ids, seeded
by the round and the client) and 64 new tokens (TESSERA_BATCH_NEW overrides it), as
bench/batch_throughput.py sends them. Both servers start once; each round runs the same clients
on A and on B, one after the other, alternating which goes first, so that a slow stretch of the
machine falls on both. With --build-b, B runs that build's binary (two builds compared under
the same load; its flags may equal A's). Prints each round (tokens/s of A and B, and B over A) and the median of
the per-round ratios as JSON lines, and whether every stream got the same tokens on both.
"""
import argparse, json, os, random, shlex, statistics

from serve_util import CompletionServer, run_clients

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("model")
ap.add_argument("rounds", type=int)
ap.add_argument("streams", type=int)
ap.add_argument("--a", required=True, help="serve flags of A (one string)")
ap.add_argument("--b", required=True, help="serve flags of B (one string)")
ap.add_argument("--build-b", help="B runs this build's bin/tessera (default: BUILD_DIR's)")
args = ap.parse_args()
bin_ = os.path.join(args.build, "bin", "tessera")
bin_b = os.path.join(args.build_b or args.build, "bin", "tessera")
config = os.path.join(args.model, "config.json")
vocab = json.load(open(config))["vocab_size"] if os.path.isdir(args.model) else 30000
PROMPT, NEW = 16, int(os.environ.get("TESSERA_BATCH_NEW", "64"))


a, b = (CompletionServer(exe, args.model, args.streams, shlex.split(f), "tessera-ab-", NEW)
        for exe, f in ((bin_, args.a), (bin_b, args.b)))
try:
    warm = [random.Random(-1).randrange(vocab) for _ in range(PROMPT)]
    a.complete(warm)
    b.complete(warm)
    rows = []
    for r in range(args.rounds):
        rng = random.Random(r)
        prompts = [[rng.randrange(vocab) for _ in range(PROMPT)] for _ in range(args.streams)]
        got = {}
        for name, server in ([("a", a), ("b", b)] if r % 2 == 0 else [("b", b), ("a", a)]):
            got[name] = run_clients(server, prompts)
        row = {"round": r, "tokens_per_s_a": round(got["a"][0], 2), "tokens_per_s_b": round(got["b"][0], 2),
               "b_over_a": round(got["b"][0] / got["a"][0], 3), "same_tokens": got["a"][1] == got["b"][1]}
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(json.dumps({"median_b_over_a": statistics.median(x["b_over_a"] for x in rows),
                      "median_tokens_per_s_a": statistics.median(x["tokens_per_s_a"] for x in rows),
                      "median_tokens_per_s_b": statistics.median(x["tokens_per_s_b"] for x in rows),
                      "all_same_tokens": all(x["same_tokens"] for x in rows), "rounds": args.rounds,
                      "streams": args.streams, "new_tokens": NEW, "a": args.a, "b": args.b, "build_b": bin_b}), flush=True)
finally:
    a.stop()
    b.stop()
