#!/usr/bin/env python3
"""auto's generation against every plan it chose from, measured in the same run (issue 27).

  python3 bench/generation_pairs.py BUILD_DIR MODEL LINK SEQ NEW ROUNDS [SPEEDS]

For one cell (2 local devices x 1 thread, LINK, device speeds SPEEDS (1,1), a SEQ-token
prompt, NEW greedy tokens): `plan --generate NEW --json` lists the rows auto chooses from;
every feasible exact row that decodes is then run as the planner split it (`run
--strategy S [--decode-strategy D] --partition ...`), beside `run --strategy auto`, in
ROUNDS rounds whose order rotates. A run's time is its generation: prefill_ms + (NEW - 1)
x ms_per_token (its --stats). Prints one JSON line: each plan's median, auto's plan and
its ratio to the best plan measured and to the terminal alone.
"""
import json, os, statistics, subprocess, sys

build, model, link, seq, new, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
speeds = sys.argv[7] if len(sys.argv) > 7 else "1,1"
bin_ = os.path.join(build, "bin", "tessera")
for v in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
    os.environ.pop(v, None)
ids = ",".join(str(1000 + i) for i in range(seq))
common = ["--threads-per-device", "1"]


def tessera(args):
    out = subprocess.run([bin_, *args], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def layers_flag(layer_map):
    # [0,0,1,1] -> "0-1:0,2-3:1" (contiguous runs)
    runs, start = [], 0
    for i in range(1, len(layer_map) + 1):
        if i == len(layer_map) or layer_map[i] != layer_map[start]:
            runs.append(f"{start}-{i - 1}:{layer_map[start]}")
            start = i
    return ",".join(runs)


def shares(xs):
    return ",".join("%g" % x for x in xs)


table = tessera(["plan", "--model", model, "--devices", "2", "--device-speed", speeds, "--link", link, "--seq", str(seq),
                 "--generate", str(new), "--json", *common])
runs = {"single": ["--strategy", "single", "--device-speed", speeds.split(",")[0]]}
for r in table["rows"]:
    if not (r["feasible"] and r["exact"] and r["step_ms"]) or len(r["members"]) < 2:
        continue
    p = r["plan"]
    name = p["strategy"] + ("+" + p["decode"]["strategy"] if p.get("decode") else "")
    args = ["--strategy", p["strategy"], "--devices", "2", "--device-speed", speeds, "--link", link,
            "--partition", shares(p["ratios"])]
    if p.get("decode"):
        args += ["--decode-strategy", p["decode"]["strategy"]]
    o = p.get("options", {})
    if "layer_map" in o:
        args += ["--layers", layers_flag(o["layer_map"])]
    if "ffn_ratios" in o:
        args += ["--ffn-partition", shares(o["ffn_ratios"])]
    runs[name] = args
runs["auto"] = ["--strategy", "auto", "--devices", "2", "--device-speed", speeds, "--link", link]

times = {k: [] for k in runs}
chose = set()
names = list(runs)
for rnd in range(rounds):
    order = names[rnd % len(names):] + names[:rnd % len(names)]
    for k in order:
        j = tessera(["run", "--model", model, "--ids", ids, "--generate", str(new), "--greedy", *runs[k], *common,
                     "--reps", "1", "--warmup", "1", "--stats"])
        times[k].append(j["prefill_ms"] + (new - 1) * j["ms_per_token"])
        if k == "auto":
            chose.add(j["strategy"] + ("+" + j["decode_strategy"] if "decode_strategy" in j else ""))

med = {k: statistics.median(v) for k, v in times.items()}
plans = {k: v for k, v in med.items() if k != "auto"}
best = min(plans, key=plans.get)
print(json.dumps({"model": os.path.basename(model.rstrip("/")), "link": link, "speeds": speeds, "seq": seq, "new": new,
                  "rounds": rounds, "auto_chose": sorted(chose), "ms": {k: round(v, 1) for k, v in med.items()},
                  "best": best, "auto_over_best": round(med["auto"] / plans[best], 3),
                  "auto_over_single": round(med["auto"] / med["single"], 3)}))
