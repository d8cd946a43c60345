"""`tessera serve` for the bench scripts: started on a free port, its log in a temporary file."""
import json, re, subprocess, tempfile, threading, time, urllib.request


def start_serve(argv, prefix, wait_s=300):
    """Runs argv (the binary, "serve", its flags with "--port 0"); returns (process, port, log path) once it listens."""
    log = tempfile.NamedTemporaryFile(prefix=prefix, suffix=".log", delete=False).name
    proc = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    end = time.time() + wait_s
    while time.time() < end:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(log).read())
        if m:
            return proc, int(m.group(1)), log
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError("serve did not start: " + open(log).read())


class CompletionServer:
    """A server for concurrent greedy /v1/completions of token ids (the batching benchmarks)."""

    def __init__(self, bin_, model, streams, flags, prefix, new_tokens):
        self.new_tokens = new_tokens
        self.p, self.port, self.log = start_serve([bin_, "serve", "--model", model, "--port", "0", "--ctx-size", "256",
                                                  "--queue", str(max(16, 2 * streams)), *flags], prefix)

    def complete(self, ids):
        body = {"prompt": ids, "max_tokens": self.new_tokens, "temperature": 0}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=3600) as r:
            return json.loads(r.read())["choices"][0]["token_ids"]

    def metric(self, name):
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30).read().decode()
        m = re.search(r"\n" + re.escape(name) + r" ([0-9.e+-]+)", text)
        return float(m.group(1)) if m else 0.0

    def stop(self):
        self.p.terminate()
        self.p.wait(timeout=120)


def run_clients(server, prompts):
    """All prompts at once, one client thread each: (tokens/s over all of them, each client's tokens)."""
    out = [None] * len(prompts)
    def client(i):
        out[i] = server.complete(prompts[i])
    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    if any(o is None for o in out):
        raise RuntimeError("a request failed")
    return sum(len(o) for o in out) / seconds, out
