#!/usr/bin/env python3
"""Aggregate tokens/s of `serve --max-batch B` against `--max-batch 1` (issue 27, continuous batching).

  python3 bench/batch_throughput.py BUILD_DIR MODEL_DIR ROUNDS STREAMS BATCH [SERVE ARGS...]

STREAMS clients at once, each a greedy /v1/completions of a 16-token prompt (token ids,
seeded by the round and the client) and 64 new tokens. Both servers start once; in each
round they take the same clients one after the other (never together), alternating which
goes first. A round's figure is all completion tokens over the time from the first request
to the last answer. With --max-batch 1 each request runs alone, so its tokens are the ones
the request gets alone: the script checks that the batched server gives every stream the
same tokens. Prints each round and the medians as JSON lines, with the batched server's
mean batch occupancy (/metrics).
"""
import json, os, random, statistics, sys

from serve_util import CompletionServer, run_clients

build, model, rounds, streams, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
serve_args = sys.argv[6:]
bin_ = os.path.join(build, "bin", "tessera")
# Prompt ids below the vocabulary: a GGUF file's is not read here, and every LLM has 30000 ids.
config = os.path.join(model, "config.json")
vocab = json.load(open(config))["vocab_size"] if os.path.isdir(model) else 30000
# The figure: 16-token prompts, 64 new tokens (TESSERA_BATCH_NEW overrides the latter).
PROMPT, NEW = 16, int(os.environ.get("TESSERA_BATCH_NEW", "64"))


one = CompletionServer(bin_, model, streams, ["--max-batch", "1", *serve_args], "tessera-batch-", NEW)
many = CompletionServer(bin_, model, streams, ["--max-batch", str(batch), *serve_args], "tessera-batch-", NEW)
try:
    # Warm-up: one request each (pages in the weights).
    warm = [random.Random(-1).randrange(vocab) for _ in range(PROMPT)]
    one.complete(warm)
    many.complete(warm)
    rows = []
    for r in range(rounds):
        rng = random.Random(r)
        prompts = [[rng.randrange(vocab) for _ in range(PROMPT)] for _ in range(streams)]
        order = [("one", one), ("many", many)] if r % 2 == 0 else [("many", many), ("one", one)]
        got = {}
        for name, server in order:
            got[name] = run_clients(server, prompts)
        same = got["one"][1] == got["many"][1]
        row = {"round": r, "tokens_per_s_batch1": round(got["one"][0], 2), f"tokens_per_s_batch{batch}": round(got["many"][0], 2),
               "ratio": round(got["many"][0] / got["one"][0], 3), "streams_equal_alone": same}
        print(json.dumps(row), flush=True)
        rows.append(row)
        if not same:
            for i, (a, b) in enumerate(zip(got["one"][1], got["many"][1])):
                if a != b:
                    print(json.dumps({"stream": i, "alone": a, "batched": b}), flush=True)
    steps, rows_in_steps = many.metric("tessera_batch_occupancy_count"), many.metric("tessera_batch_occupancy_sum")
    print(json.dumps({"median_ratio": statistics.median(r["ratio"] for r in rows),
                      "median_tokens_per_s_batch1": statistics.median(r["tokens_per_s_batch1"] for r in rows),
                      f"median_tokens_per_s_batch{batch}": statistics.median(r[f"tokens_per_s_batch{batch}"] for r in rows),
                      "mean_occupancy": round(rows_in_steps / steps, 2) if steps else 0,
                      "all_streams_equal_alone": all(r["streams_equal_alone"] for r in rows),
                      "streams": streams, "max_batch": batch, "new_tokens": NEW, "serve_args": " ".join(serve_args)}), flush=True)
finally:
    one.stop()
    many.stop()
