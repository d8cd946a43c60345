"""`tessera serve` for the bench scripts: started on a free port, its log in a temporary file."""
import re, subprocess, tempfile, time


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
