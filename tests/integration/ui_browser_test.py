#!/usr/bin/python3
"""ptcoord's web UI in a real browser: ptcoord with --ui-listen runs a
two-rank job whose rank 1 is killed once (the job restarts from its
checkpoint and succeeds); headless Chromium, driven through its DevTools
protocol, logs in with the user token and loads each page. Checks: the
jobs table lists the job as succeeded; the job page's loss chart has drawn
(pixels other than the background inside the chart, read from a
screenshot), its per-rank panel has one series per rank, its events list
holds the restart; the nodes page shows the local host; signing out
through a page's form (a POST, with the page's own Origin) clears the
cookie; without the token every page and endpoint is 401 and shows no
job; a blend job's loss chart has a validation series per source. Then
without a browser:
with ptcoord's TLS the UI is HTTPS and its cookie Secure; --ui-listen off
loopback without TLS, or on a port in use, is refused at start (exit 2,
the reason named). The screenshots stay in ARTIFACTS (jobs.png, job.png,
nodes.png, logged_out.png, signed_out.png).

    ui_browser_test.py PTCOORD PTCTL SOURCE_DIR ARTIFACTS
"""
import base64
import io
import json
import os
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import websocket  # Debian: python3-websocket
from PIL import Image  # Debian: python3-pil

from promtest import wait_for

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testing"))
from ranks import ptworker_pids  # noqa: E402

TOKEN = "ui-browser-test-token"


def http(url, token=None):
    """(status, body) of a GET, with the bearer token when given."""
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class Browser:
    """Headless Chromium and one page, through the DevTools protocol."""

    def __init__(self, tmp):
        self.dir = os.path.join(tmp, "chromium")
        self.proc = subprocess.Popen(
            ["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
             "--no-first-run", "--hide-scrollbars", "--remote-debugging-port=0",
             f"--user-data-dir={self.dir}", "--window-size=1400,2400",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = os.path.join(self.dir, "DevToolsActivePort")
        port = wait_for(lambda: os.path.exists(port_file) and
                        open(port_file).read().split("\n")[0],
                        60, "Chromium's DevTools port")
        pages = wait_for(lambda: [
            t for t in json.loads(urllib.request.urlopen(
                f"http://127.0.0.1:{port}/json/list").read())
            if t["type"] == "page"], 30, "a page target")
        self.ws = websocket.create_connection(
            pages[0]["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self.next_id = 0
        self.errors = []
        self.call("Runtime.enable")
        self.call("Page.enable")

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method,
                                 "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("method") == "Runtime.exceptionThrown":
                self.errors.append(msg["params"]["exceptionDetails"])
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise SystemExit(f"FAIL: {method}: {msg['error']}")
                return msg["result"]

    # DevTools' answers to an evaluation the page left mid-way: it
    # navigated (a form submitted, a link followed) before the answer.
    NAVIGATED = ("Inspected target navigated or closed",
                 "Cannot find context with specified id")

    def eval(self, expr, navigating=False):
        """The expression's value; None, while `navigating`, when the page
        left before answering (the caller's wait asks again)."""
        try:
            r = self.call("Runtime.evaluate", expression=expr,
                          returnByValue=True, awaitPromise=True)
        except SystemExit as e:
            if navigating and any(m in str(e) for m in self.NAVIGATED):
                return None
            raise
        if "exceptionDetails" in r:
            raise SystemExit(f"FAIL: {expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def goto(self, url):
        self.call("Page.navigate", url=url)
        wait_for(lambda: self.eval("document.readyState", navigating=True)
                 == "complete", 30, f"{url} to load")

    def rect(self, element_id):
        """The element's box in CSS pixels of the page (x, y, w, h)."""
        return self.eval(
            "(r => ({x: r.x + scrollX, y: r.y + scrollY, w: r.width, "
            f"h: r.height}}))(document.getElementById('{element_id}')"
            ".getBoundingClientRect())")

    def screenshot(self, path):
        png = base64.b64decode(self.call("Page.captureScreenshot",
                                         format="png")["data"])
        with open(path, "wb") as f:
            f.write(png)
        return Image.open(io.BytesIO(png)).convert("RGB")

    def close(self):
        self.proc.kill()
        self.proc.wait()


def check_tls_and_refusals(ptcoord, tmp, check):
    """HTTPS under ptcoord's TLS; the refusals at start."""
    def start(name, *flags):
        return subprocess.Popen(
            [ptcoord, "--listen", "127.0.0.1:0", "--state-dir",
             f"{tmp}/{name}", "--token-file", f"{tmp}/tokens",
             "--log-level", "warn", *flags],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    p = start("open", "--ui-listen", "0.0.0.0:0")
    out, err = p.communicate(timeout=30)
    check("--ui-listen off loopback without TLS is refused",
          p.returncode == 2 and "--ui-insecure" in err, f"{p.returncode} {err}")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = start("taken", "--ui-listen", f"127.0.0.1:{port}")
        out, err = p.communicate(timeout=30)
        check("--ui-listen on a port in use is refused",
              p.returncode == 2 and f"--ui-listen 127.0.0.1:{port}" in err,
              f"{p.returncode} {err}")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
         "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
         f"{tmp}/ui.key", "-out", f"{tmp}/ui.pem", "-days", "2", "-subj",
         "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True)
    p = start("tls", "--tls-cert", f"{tmp}/ui.pem", "--tls-key",
              f"{tmp}/ui.key", "--ui-listen", "127.0.0.1:0")
    try:
        url = wait_for(lambda: os.path.exists(f"{tmp}/tls/ui_address") and
                       open(f"{tmp}/tls/ui_address").read().strip(), 30,
                       "the TLS UI's address")
        check("with TLS the UI is HTTPS", url.startswith("https://"), url)
        ctx = ssl.create_default_context(cafile=f"{tmp}/ui.pem")
        req = urllib.request.Request(url + "api/v1/nodes", headers={
            "Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            check("an endpoint answers over TLS", r.status == 200)
        login = urllib.request.Request(
            url + "login", data=f"token={TOKEN}".encode(), method="POST")

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args):
                return None

        opener = urllib.request.build_opener(
            NoRedirect, urllib.request.HTTPSHandler(context=ctx))
        try:
            cookie = opener.open(login, timeout=10).headers["Set-Cookie"]
        except urllib.error.HTTPError as e:
            cookie = e.headers["Set-Cookie"] or ""
        check("the login cookie is Secure under TLS", "; Secure" in cookie,
              cookie)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait()


def write_token_file(path, tokens):
    """An llm.c token file of uint16 tokens (no tokenizer beside it)."""
    header = [20240520, 1, len(tokens)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack(f"<256i{len(tokens)}H", *header, *tokens))


def drawn_pixels(image, rect, dpr):
    """Pixels unlike the background (the commonest colour) in the inner part
    of `rect` (CSS pixels), where the chart's lines are."""
    x0, y0 = int((rect["x"] + 0.15 * rect["w"]) * dpr), int(
        (rect["y"] + 0.1 * rect["h"]) * dpr)
    x1, y1 = int((rect["x"] + 0.95 * rect["w"]) * dpr), int(
        (rect["y"] + 0.8 * rect["h"]) * dpr)
    crop = image.crop((x0, y0, x1, y1))
    colours = crop.getcolors(crop.width * crop.height)
    background = max(colours)[1]
    return sum(n for n, c in colours
               if sum(abs(a - b) for a, b in zip(c, background)) > 60)


def main():
    ptcoord, ptctl, src, artifacts = sys.argv[1:5]
    os.makedirs(artifacts, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="ptrain_ui_")
    with open(f"{tmp}/tokens", "w") as f:
        f.write(TOKEN + "\n")
    os.makedirs(f"{tmp}/ck")
    env = dict(os.environ, OMPI_MCA_mpi_yield_when_idle="1")
    coord = subprocess.Popen(
        [ptcoord, "--listen", "127.0.0.1:0", "--state-dir", f"{tmp}/state",
         "--local-slots", "2", "--token-file", f"{tmp}/tokens",
         "--data-root", os.path.join(src, "data"), "--data-root", f"{tmp}/ck",
         "--ui-listen", "127.0.0.1:0", "--log-level", "warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    browser = None
    failures = []

    def check(what, ok, detail=""):
        print(f"{'ok  ' if ok else 'FAIL'} {what}" + (f": {detail}" if detail
                                                      and not ok else ""))
        if not ok:
            failures.append(what)

    try:
        read = lambda name: (open(f"{tmp}/state/{name}").read().strip()
                             if os.path.exists(f"{tmp}/state/{name}") else "")
        server = wait_for(lambda: read("address"), 30, "ptcoord's address")
        ui = wait_for(lambda: read("ui_address"), 30, "the UI's address")
        cenv = dict(env, PTCTL_SERVER=server, PTCTL_TOKEN=TOKEN)
        job = subprocess.run(
            [ptctl, "submit", os.path.join(src, "examples/shakespeare-char.yaml"),
             "--set", "parallel.dp=2", "--set", "train.steps=600",
             "--set", "model.n_layer=1", "--set", "model.n_embd=32",
             "--set", "train.eval_every=40", "--set", "train.sample_every=120",
             "--set", "train.sample_tokens=40", "--set", "checkpoint.every=20",
             "--set", f"checkpoint.dir={tmp}/ck",
             "--set", "restart.max_restarts=2"],
            env=cenv, capture_output=True, text=True, check=True).stdout.split()[0]
        api = f"{ui}api/v1/jobs/{job}"

        def step():
            status, body = http(api, TOKEN)
            return json.loads(body)["job"]["step"] if status == 200 else 0

        wait_for(lambda: step() >= 50, 120, "step 50")
        pids = wait_for(lambda: ptworker_pids(
            f"PTRAIN_COORDINATOR={server}", f"PTRAIN_JOB_ID={job}",
            "OMPI_COMM_WORLD_RANK=1"), 30, "rank 1")
        os.kill(pids[0], signal.SIGKILL)
        print(f"killed rank 1 (pid {pids[0]}) at step {step()}")

        def final():
            status, body = http(api, TOKEN)
            state = json.loads(body)["job"]["state"] if status == 200 else ""
            return state if state in ("succeeded", "failed", "cancelled") \
                else ""

        check("the job succeeded after the restart",
              wait_for(final, 300, "the job to end") == "succeeded")

        # A running job cancelled: once ended it shows its state alone, not
        # also "cancelling". It is a Mixture-of-Experts model: its page shows
        # the expert load; and it trains on a blend of two sources: its loss
        # chart has a validation series per source.
        blend = []
        for k, name in enumerate(["web", "code"]):
            tokens = [(7 * i + k) % 60 for i in range(2000)]
            for split in ["train", "val"]:
                write_token_file(f"{tmp}/ck/{name}_{split}.bin", tokens)
            blend.append(f"{{train_bin: {tmp}/ck/{name}_train.bin, val_bin: "
                         f"{tmp}/ck/{name}_val.bin, weight: {1 - k * 0.5}}}")
        cancelled = subprocess.run(
            [ptctl, "submit", os.path.join(src, "examples/shakespeare-char.yaml"),
             "--set", "train.steps=100000", "--set", "model.n_layer=2",
             "--set", "model.n_embd=32", "--set", "model.moe.experts=4",
             "--set", "model.vocab_size=64", "--set", "data.path=''",
             "--set", f"data.blend=[{', '.join(blend)}]",
             "--set", "train.eval_every=5", "--set", "train.sample_tokens=0",
             "--set", f"checkpoint.dir={tmp}/ck"],
            env=cenv, capture_output=True, text=True,
            check=True).stdout.split()[0]

        def state_of(j):
            status, body = http(f"{ui}api/v1/jobs/{j}", TOKEN)
            return json.loads(body)["job"]["state"] if status == 200 else ""

        def experts_of(j):
            status, body = http(f"{ui}api/v1/jobs/{j}", TOKEN)
            return json.loads(body).get("experts") if status == 200 else None

        def sources_of(j):
            status, body = http(f"{ui}api/v1/jobs/{j}/metrics", TOKEN)
            if status != 200:
                return None
            return [p["val_loss_by_source"] for p in json.loads(body)["points"]
                    if p.get("val_loss_by_source")]

        wait_for(lambda: state_of(cancelled) == "running", 60, "job 2 to run")
        wait_for(lambda: experts_of(cancelled), 60, "job 2's expert load")
        wait_for(lambda: len(sources_of(cancelled) or []) >= 2, 60,
                 "job 2's second evaluation")
        subprocess.run([ptctl, "cancel", cancelled], env=cenv, check=True,
                       capture_output=True)
        wait_for(lambda: state_of(cancelled) == "cancelled", 60,
                 "job 2 to be cancelled")

        # Without the token: 401 everywhere, and no job in sight.
        for path in ["", "nodes", f"jobs/{job}", "static/ui.js",
                     "api/v1/jobs", f"api/v1/jobs/{job}",
                     f"api/v1/jobs/{job}/metrics", "api/v1/nodes"]:
            status, body = http(ui + path)
            check(f"/{path} without the token is 401 and shows no job",
                  status == 401 and job not in body, f"{status}")

        browser = Browser(tmp)
        browser.goto(f"{ui}jobs/{job}")
        shot = browser.screenshot(f"{artifacts}/logged_out.png")
        check("logged out, the job page is the login form",
              browser.eval("!!document.querySelector('input[name=token]')") and
              job not in browser.eval("document.body.innerText"))

        # Log in through the form.
        browser.goto(f"{ui}login")
        browser.eval(f"document.querySelector('input[name=token]').value = "
                     f"{json.dumps(TOKEN)}; document.querySelector('form')"
                     f".submit(); true", navigating=True)
        wait_for(lambda: browser.eval("location.pathname", navigating=True)
                 == "/" and browser.eval("document.readyState",
                                         navigating=True) == "complete", 30,
                 "the jobs page")
        row = wait_for(lambda: browser.eval(
            f"(r => r && r.dataset.state)(document.querySelector("
            f"'#jobs tr[data-job=\"{job}\"]'))"), 30, "the job's row")
        check("the jobs table lists the job as succeeded", row == "succeeded",
              row)
        flag = browser.eval(
            f"(r => r && (r.querySelector('.flag') || {{}}).textContent || '')"
            f"(document.querySelector('#jobs tr[data-job=\"{cancelled}\"]'))")
        check("a cancelled job shows no 'cancelling' beside its state",
              flag == "", flag)
        browser.screenshot(f"{artifacts}/jobs.png")

        browser.goto(f"{ui}jobs/{job}")
        wait_for(lambda: browser.eval("document.body.dataset.loaded") == "1",
                 30, "the job page's charts")
        time.sleep(0.5)  # one more poll's drawing
        ranks = browser.eval("document.body.dataset.ranks")
        check("the per-rank panel has one series per rank", ranks == "2",
              ranks)
        kinds = browser.eval("[...document.querySelectorAll('#events li')]"
                             ".map(li => li.dataset.kind)")
        check("an event marks the killed rank's restart", "restart" in kinds,
              kinds)
        sample = browser.eval("document.querySelector('#sample').textContent")
        check("the latest sample is shown", "ROMEO:" in (sample or ""), sample)
        rect = browser.rect("chart-loss")
        dpr = browser.eval("devicePixelRatio")
        browser.eval("window.scrollTo(0, 0); true")
        shot = browser.screenshot(f"{artifacts}/job.png")
        drawn = drawn_pixels(shot, rect, dpr)
        check("the loss chart has drawn", drawn > 300, f"{drawn} pixels")
        # The restarted attempt trained for seconds: rank reports came.
        drawn = drawn_pixels(shot, browser.rect("chart-rank-step"), dpr)
        check("the per-rank chart has drawn", drawn > 100, f"{drawn} pixels")
        check("no script error on the page", not browser.errors,
              browser.errors)
        check("a dense job's page shows no expert load",
              browser.eval("document.querySelector('#experts-panel').hidden"))

        # The MoE job's page: one heat-map row per layer, one cell per
        # expert, and the shares of each row add up to all its tokens.
        browser.goto(f"{ui}jobs/{cancelled}")
        wait_for(lambda: browser.eval("document.body.dataset.loaded") == "1",
                 30, "the MoE job's page")
        time.sleep(0.5)
        shape = browser.eval(
            "[...document.querySelectorAll('#experts tbody tr')]"
            ".map(r => r.querySelectorAll('td').length)")
        check("the expert-load panel has a row of 4 experts (+ imbalance, "
              "dropped) per MoE layer", shape == [6, 6], shape)
        shares = browser.eval(
            "[...document.querySelectorAll('#experts tbody tr')].map(r => "
            "[...r.querySelectorAll('td')].slice(0, 4)"
            ".reduce((a, td) => a + parseFloat(td.textContent), 0))")
        check("each layer's shares add up to 100%",
              shares and all(abs(x - 100) < 0.5 for x in shares), shares)
        browser.screenshot(f"{artifacts}/experts.png")
        sources = browser.eval("document.body.dataset.valSources")
        check("the blend job's loss chart has a validation series per source",
              sources == "code,web", sources)
        points = browser.eval(
            "Chart.getChart('chart-loss').data.datasets.slice(3)"
            ".map(d => d.data.length)")
        check("each source's series holds the job's evaluations",
              points and len(points) == 2 and min(points) >= 2, points)
        check("no script error on the MoE job's page", not browser.errors,
              browser.errors)

        browser.goto(f"{ui}nodes")
        local = wait_for(lambda: browser.eval(
            "document.querySelectorAll('#nodes tr[data-node]').length"), 30,
            "the nodes table")
        check("the nodes page shows the local host", local >= 1, local)
        cores = browser.eval(
            "document.querySelector('#nodes tr[data-node=\"local\"]')"
            ".cells[4].textContent")
        check("the local host's row gives its cores", (cores or "").isdigit(),
              cores)
        browser.screenshot(f"{artifacts}/nodes.png")

        # Sign out through the header's form: a POST that names the page's
        # origin, which ptcoord checks; the cookie is gone after it.
        browser.eval("document.querySelector('form.signout button').click(); "
                     "true")
        wait_for(lambda: browser.eval("location.pathname") == "/login" and
                 browser.eval("document.readyState") == "complete", 30,
                 "the login page after signing out")
        status = browser.eval("fetch('/api/v1/nodes').then(r => r.status)")
        check("signing out clears the cookie", status == 401, status)
        browser.screenshot(f"{artifacts}/signed_out.png")
        check_tls_and_refusals(ptcoord, tmp, check)
    finally:
        if browser:
            browser.close()
        coord.send_signal(signal.SIGTERM)
        coord.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"screenshots in {artifacts}")
    if failures:
        raise SystemExit(f"FAIL: {len(failures)} check(s): {failures}")
    print("ui browser test: ok")


if __name__ == "__main__":
    main()
