#!/usr/bin/env python3
"""Soak and failover for `tessera serve` (issue 15), loopback only; run by bench/soak.sh.

A GPT-2 server and a BERT server, each on the terminal plus 2 loopback daemons
(`tessera worker`, through a cluster file). CLIENTS concurrent clients (default 4) send REQUESTS
mixed requests (completions, streamed completions, embeddings, classification,
5% invalid); about every 100 requests a random daemon is killed (SIGKILL) and
restarted after a pause. Every valid answer is compared with its single-device
reference (tessera generate / tessera run --dump), every invalid one must be a
400. Prints a JSON summary: failures, mismatches, RSS growth after warm-up,
p50/p99 latency, failovers.
"""
import json, os, random, signal, socket, struct, subprocess, sys, tempfile, threading, time, urllib.request, urllib.error

bin_, requests_total, data = sys.argv[1], int(sys.argv[2]), sys.argv[3]
clients_n = int(sys.argv[4]) if len(sys.argv) > 4 else 4
work = tempfile.mkdtemp(prefix="tessera-soak-")
rng = random.Random(15)
procs = []


def spawn(args, log):
    p = subprocess.Popen([bin_] + args, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    procs.append(p)
    return p


def free_ports(n):
    """n consecutive free ports (a daemon's data port is the one after its control port)."""
    for _ in range(100):
        base = rng.randrange(20000, 30000)
        try:
            socks = []
            for k in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + k))
            return list(range(base, base + n))
        except OSError:
            pass
        finally:
            for s in socks:
                s.close()
    sys.exit("no free ports")


def tensor(path, name):
    with open(path, "rb") as f:
        buf = f.read()
    n = struct.unpack("<Q", buf[:8])[0]
    info = json.loads(buf[8:8 + n])[name]
    a, b = info["data_offsets"]
    return list(struct.unpack("<%df" % ((b - a) // 4), buf[8 + n + a:8 + n + b]))


# References on one device.
prompts = [[rng.randrange(512) for _ in range(rng.randrange(2, 12))] for _ in range(8)]
gen_tokens = 12
ref_tokens = []
for p in prompts:
    out = subprocess.run([bin_, "generate", "--model", data + "/gpt2-tiny", "--ids", ",".join(map(str, p)),
                          "--max-new-tokens", str(gen_tokens), "--greedy"], capture_output=True, text=True, check=True)
    ref_tokens.append([int(x) for x in out.stdout.strip().split(",")])
texts = [[101] + [rng.randrange(512) for _ in range(rng.randrange(1, 10))] + [102] for _ in range(8)]
ref_pool, ref_logits = [], []
for i, t in enumerate(texts):
    dump = f"{work}/bert{i}.safetensors"
    subprocess.run([bin_, "run", "--model", data + "/bert-tiny", "--ids", ",".join(map(str, t)), "--dump", dump],
                   capture_output=True, check=True)
    ref_pool.append(tensor(dump, "pooler_output"))
    ref_logits.append(tensor(dump, "logits"))

# Daemons and servers.
subprocess.run([bin_, "keygen", "--out", f"{work}/k.key"], capture_output=True, check=True)
ports = free_ports(10)
daemon_ports = [ports[0], ports[2], ports[4], ports[6]]  # data on the next port
daemons = {}


def start_daemon(port):
    daemons[port] = spawn(["worker", "--listen", f"tcp://127.0.0.1:{port}", "--key", f"{work}/k.key", "--models", data],
                          f"{work}/daemon-{port}.log")


for p in daemon_ports:
    start_daemon(p)
time.sleep(1.0)


def start_server(name, model, workers, terminal):
    cluster = f"{work}/{name}.toml"
    with open(cluster, "w") as f:
        f.write(f'terminal = "tcp://127.0.0.1:{terminal}"\nworkers = [' +
                ", ".join(f'"tcp://127.0.0.1:{w}"' for w in workers) + "]\n")
    log = f"{work}/{name}.log"
    proc = spawn(["serve", "--model", f"{data}/{model}", "--cluster", cluster, "--key", f"{work}/k.key", "--strategy", "tp",
                  "--port", "0", "--queue", "8", *os.environ.get("SOAK_SERVE_ARGS", "").split()], log)
    for _ in range(1200):
        text = open(log).read()
        if "listening on http://127.0.0.1:" in text:
            port = int(text.split("listening on http://127.0.0.1:")[1].split()[0])
            return proc, port, log
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    sys.exit(f"the {name} server did not start:\n" + open(log).read())


gpt2, gpt2_port, gpt2_log = start_server("gpt2", "gpt2-tiny", daemon_ports[:2], ports[8])
bert, bert_port, bert_log = start_server("bert", "bert-tiny", daemon_ports[2:], ports[9])


def post(port, path, body, stream=False):
    data_ = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data_, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            if not stream:
                return r.status, json.loads(r.read())
            tokens, done, finish = [], False, None
            for line in r:
                line = line.decode().strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                ev = json.loads(line[6:])
                if "choices" not in ev:
                    return 500, ev
                tokens += ev["choices"][0]["token_ids"]
                finish = ev["choices"][0]["finish_reason"] or finish
            return r.status, {"tokens": tokens, "done": done, "finish": finish}
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


invalid_bodies = [
    (gpt2_port, "/v1/completions", b"{not json"),
    (gpt2_port, "/v1/completions", {"prompt": [1, "x"]}),
    (gpt2_port, "/v1/completions", {"prompt": [1, 2], "max_tokens": "ten"}),
    (gpt2_port, "/v1/completions", {"prompt": [99999]}),
    (bert_port, "/v1/embeddings", {"input": {"a": 1}}),
    (bert_port, "/v1/embeddings", {"input": [1], "encoding_format": "int4"}),
    (bert_port, "/v1/classify", {"image": "***"}),
]

lock = threading.Lock()
stats = {"sent": 0, "valid_failed": 0, "mismatch": 0, "invalid_not_400": 0, "invalid": 0, "kills": 0}
latencies, problems = [], []
rss = {}


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def close(a, b, tol=1e-4):
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b))


def one(i, r):
    kind = r.random()
    t0 = time.monotonic()
    valid = True
    if kind < 0.05:
        valid = False
        port, path, body = invalid_bodies[r.randrange(len(invalid_bodies))]
        status, _ = post(port, path, body)
        ok = status == 400
    elif kind < 0.35:
        k = r.randrange(len(prompts))
        status, j = post(gpt2_port, "/v1/completions", {"prompt": prompts[k], "max_tokens": gen_tokens, "temperature": 0})
        ok = status == 200 and j["choices"][0]["token_ids"] == ref_tokens[k]
    elif kind < 0.6:
        k = r.randrange(len(prompts))
        status, j = post(gpt2_port, "/v1/completions",
                         {"prompt": prompts[k], "max_tokens": gen_tokens, "temperature": 0, "stream": True}, stream=True)
        ok = status == 200 and j["tokens"] == ref_tokens[k] and j["done"]
    elif kind < 0.85:
        k = r.randrange(len(texts))
        status, j = post(bert_port, "/v1/embeddings", {"input": [texts[k]]})
        ok = status == 200 and close(j["data"][0]["embedding"], ref_pool[k])
    else:
        k = r.randrange(len(texts))
        status, j = post(bert_port, "/v1/classify", {"input": [texts[k]]})
        ok = status == 200 and all(abs(l["logit"] - ref_logits[k][int(l["label"][-1])]) <= 1e-4 for l in j["data"][0]["labels"])
    ms = (time.monotonic() - t0) * 1000
    with lock:
        stats["sent"] += 1
        if not valid:
            stats["invalid"] += 1
            stats["invalid_not_400"] += not ok
        else:
            latencies.append(ms)
            if status != 200:
                stats["valid_failed"] += 1
                problems.append(f"request {i}: HTTP {status} {json.dumps(j)[:300]}")
            elif not ok:
                stats["mismatch"] += 1
                problems.append(f"request {i}: answer differs from the reference")


counter = iter(range(requests_total))
kill_due = {}  # century -> Event set once its kill was made
WARM_UP = 250  # requests (two kill/restart cycles) before the RSS baseline


def client(seed):
    r = random.Random(seed)
    for i in counter:
        if i > 0 and i % 100 == 0 and i < requests_total - 50:
            kill_due.setdefault(i, threading.Event())
            kill_due[i].wait(timeout=120)  # requests keep flowing on the other clients
        if i == WARM_UP:
            with lock:
                rss["warm"] = (rss_kib(gpt2.pid), rss_kib(bert.pid))
        one(i, r)


def faults(stop):
    century = 100
    while not stop.is_set() and century < requests_total - 50:
        with lock:
            sent = stats["sent"]
        if sent >= century - 3 and os.environ.get("SOAK_NO_FAULTS"):  # a baseline without faults
            kill_due.setdefault(century, threading.Event()).set()
            century += 100
        elif sent >= century - 3:  # the clients are at the mark
            port = rng.choice(daemon_ports)
            daemons[port].send_signal(signal.SIGKILL)
            daemons[port].wait()
            stats["kills"] += 1
            kill_due.setdefault(century, threading.Event()).set()
            # Restarted after a pause, while the requests go on; the next
            # kill comes after the restart.
            stop.wait(1.0)
            start_daemon(port)
            century += 100
        time.sleep(0.005)


t_start = time.monotonic()
stop = threading.Event()
ft = threading.Thread(target=faults, args=(stop,))
ft.start()
clients = [threading.Thread(target=client, args=(s,)) for s in range(clients_n)]
for c in clients:
    c.start()
for c in clients:
    c.join()
stop.set()
ft.join()

wall = time.monotonic() - t_start
rss["end"] = (rss_kib(gpt2.pid), rss_kib(bert.pid))


def failovers(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
        for line in r.read().decode().splitlines():
            if line.startswith("tessera_failovers_total "):
                return int(line.split()[1])
    return -1


fo = {"gpt2": failovers(gpt2_port), "bert": failovers(bert_port)}
for p in (gpt2, bert):
    p.send_signal(signal.SIGTERM)
exit_codes = [p.wait(timeout=60) for p in (gpt2, bert)]
for p in procs:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
latencies.sort()
pct = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else 0.0
growth = [(e - w) / w for w, e in zip(rss["warm"], rss["end"])]
summary = dict(stats, wall_s=round(wall, 1), p50_ms=round(pct(0.5), 2), p99_ms=round(pct(0.99), 2),
               rss_warm_kib=rss["warm"], rss_end_kib=rss["end"], rss_growth=[round(g, 4) for g in growth],
               failovers=fo, exit_codes=exit_codes, problems=problems[:10], logs=work)
print(json.dumps(summary, indent=1))
ok = (stats["valid_failed"] == 0 and stats["mismatch"] == 0 and stats["invalid_not_400"] == 0 and
      all(g <= 0.10 for g in growth) and exit_codes == [0, 0])
sys.exit(0 if ok else 1)
