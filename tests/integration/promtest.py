"""What the integration tests share: HTTP GET, polling, free ports, a real
Prometheus started on a configuration, its instant queries, and waiting
until a list of queries all return data."""
import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request


def get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def wait_for(pred, seconds, what):
    """pred()'s first truthy value within `seconds`; exits naming `what`."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.3)
    raise SystemExit(f"timed out waiting for {what}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(port, expr):
    """The instant query's result vector; RuntimeError when Prometheus says
    the query failed (urllib's HTTPError when it refuses it)."""
    body = json.loads(get(f"http://127.0.0.1:{port}/api/v1/query?" +
                          urllib.parse.urlencode({"query": expr})))
    if body.get("status") != "success":
        raise RuntimeError(f"query failed: {expr}: {body}")
    return body["data"]["result"]


def start_prometheus(prometheus, config, tmp):
    """Prometheus on `config` with its data under `tmp`: (process, port)."""
    port = free_port()
    proc = subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp}/tsdb",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port


def without_data(port, exprs, seconds):
    """The (title, expr) pairs of `exprs` still without data after polling
    for up to `seconds` (rates and quantiles need a few scrapes)."""
    missing = exprs
    deadline = time.time() + seconds
    while missing and time.time() < deadline:
        time.sleep(2)
        try:
            missing = [(t, e) for t, e in missing if not query(port, e)]
        except OSError:
            continue  # prometheus still starting
    return missing
