#!/usr/bin/env python3
"""`tessera serve` under hostile clients (issue 27), loopback only; prints JSON.

  python3 bench/hostile_clients.py [BUILD_DIR] [DATA_DIR]     (build, tests/data)

Four measurements, each on a fresh server with gpt2-tiny:
- starve: 100 idle connections, 20 stuck mid-header and 20 that declared a 1 GB body
  are held open; then the seconds /health and a 2-token completion take.
- oversize: the seconds to the first byte of the answer to a 1 GB Content-Length.
- stopped_worker: tp on 2 local devices, --failover-timeout 500; the worker process is
  stopped (SIGSTOP); the seconds the next 8-token completion takes.
- abandoned: tp on 2 devices over 1gbit,5ms; three 100-token whole completions are cut
  after 0.3 s each; the seconds the next 2-token completion takes, and the abandoned
  counter of /metrics.
"""
import json, os, re, signal, socket, subprocess, sys, tempfile, time, urllib.request

from serve_util import start_serve

build = sys.argv[1] if len(sys.argv) > 1 else "build"
data = sys.argv[2] if len(sys.argv) > 2 else "tests/data"
bin_ = os.path.join(build, "bin", "tessera")
model = os.path.join(data, "gpt2-tiny")


class Serve:
    def __init__(self, *args):
        self.p, self.port, self.log = start_serve([bin_, "serve", "--model", model, "--port", "0", *args], "tessera-hostile-")

    def post(self, body, timeout=120):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(req, timeout=timeout).read())

    def get(self, path, timeout=120):
        return urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout).read().decode()

    def connect(self, first=b""):
        s = socket.create_connection(("127.0.0.1", self.port))
        if first:
            s.sendall(first)
        return s

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()


def timed(f):
    t = time.time()
    f()
    return round(time.time() - t, 4)


out = {}
s = Serve("--devices", "1")
held = [s.connect() for _ in range(100)]
held += [s.connect(b"GET /health HTTP/1.1\r\nHo") for _ in range(20)]
huge = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n"
held += [s.connect(huge) for _ in range(20)]
out["starve"] = {"health_s": timed(lambda: s.get("/health")),
                 "completion_s": timed(lambda: s.post({"prompt": [1, 2, 3], "max_tokens": 2}))}
c = s.connect(huge)
t = time.time()
c.recv(16)
out["oversize"] = {"first_byte_s": round(time.time() - t, 4)}
for x in held + [c]:
    x.close()
s.stop()

s = Serve("--devices", "2", "--strategy", "tp", "--failover-timeout", "500")
s.post({"prompt": [1, 2, 3], "max_tokens": 2})
kids = [int(n) for n in os.listdir("/proc") if n.isdigit() and
        open(f"/proc/{n}/stat").read().rsplit(")", 1)[1].split()[1] == str(s.p.pid)]
os.kill(kids[0], signal.SIGSTOP)
out["stopped_worker"] = {"failover_timeout_s": 0.5,
                         "completion_s": timed(lambda: s.post({"prompt": [1, 2, 3], "max_tokens": 8}))}
s.stop()

s = Serve("--devices", "2", "--strategy", "tp", "--link", "1gbit,5ms")
body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 100, "temperature": 0}).encode()
for _ in range(3):
    x = s.connect(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    time.sleep(0.3)
    x.close()
nxt = timed(lambda: s.post({"prompt": [1, 2, 3], "max_tokens": 2}))
whole = timed(lambda: s.post({"prompt": [1, 2, 3], "max_tokens": 100, "temperature": 0}))
m = re.search(r"tessera_requests_abandoned_total (\d+)", s.get("/metrics"))
out["abandoned"] = {"next_completion_s": nxt, "whole_100_token_s": whole, "abandoned_total": int(m.group(1)) if m else None}
s.stop()
print(json.dumps(out, indent=1))
