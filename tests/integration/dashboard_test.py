#!/usr/bin/python3
"""The Grafana dashboard against a live job: two ranks serve /metrics, a real
Prometheus scrapes them, and every query of dashboards/ptrain-job.json must
return series for each rank it is about. The job is context-parallel (cp=2:
its ranks exchange ring attention's blocks, group "cp", and sum gradients
over dp x cp, group "dp"): the communication panel must show both groups. Fails if a metric name, a label or a
query of the dashboard is wrong. Panels of GPU metrics (ptrain_gpu_*), of
Mixture-of-Experts metrics (ptrain_moe_*) and of a blend's sources (the
series with a `source` label) have no data on this dense CPU job on one
text: their queries must still be valid PromQL, name metrics docs/metrics.md
documents, and return nothing here.

    dashboard_test.py PTWORKER_PATH SOURCE_DIR
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error

from promtest import query, start_prometheus, without_data


def main():
    ptworker, src = sys.argv[1], sys.argv[2]
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        sys.exit("prometheus is not installed (scripts/setup.sh installs it)")
    tmp = tempfile.mkdtemp(prefix="ptrain_dashboard_")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_mpi_yield_when_idle="1", OMP_NUM_THREADS="1")
    log = open(os.path.join(tmp, "worker.log"), "w+")
    worker = subprocess.Popen(
        ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl",
         "self,vader,tcp", "-n", "2", ptworker, "--config",
         os.path.join(src, "examples/shakespeare-char.yaml"),
         "--set", "parallel.cp=2", "--set", "train.steps=100000",
         "--set", "model.n_layer=1", "--set", "model.n_embd=32",
         "--set", "train.eval_every=20", "--set", "train.eval_batches=1",
         "--set", f"checkpoint.dir={tmp}/ck", "--set", "checkpoint.every=50",
         "--peak-gflops", "100", "--metrics-bind", "127.0.0.1:0"],
        cwd=src, env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    prom = None
    try:
        ports = []
        deadline = time.time() + 60
        while len(ports) < 2 and time.time() < deadline:
            time.sleep(0.2)
            log.seek(0)
            ports = re.findall(r"serves metrics on port (\d+)", log.read())
        if len(ports) < 2:
            log.seek(0)
            sys.exit("ranks did not start their metrics:\n" + log.read())
        with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
            f.write("global: {scrape_interval: 1s}\n"
                    "scrape_configs:\n"
                    "  - job_name: ptrain-ranks\n"
                    "    honor_labels: true\n"
                    "    static_configs: [{targets: [%s]}]\n" %
                    ", ".join(f'"127.0.0.1:{p}"' for p in ports))
        prom, web = start_prometheus(prometheus, f"{tmp}/prometheus.yml", tmp)
        dash = json.load(open(os.path.join(src, "dashboards/ptrain-job.json")))
        all_exprs = [(p["title"], t["expr"].replace("$job", "shakespeare-char"))
                     for p in dash["panels"] for t in p["targets"]]
        gpu = re.compile(r'\bptrain_(?:gpu|moe)_\w+|source!=""')
        exprs = [(t, e) for t, e in all_exprs if not gpu.search(e)]
        gpu_exprs = [(t, e) for t, e in all_exprs if gpu.search(e)]
        documented = open(os.path.join(src, "docs/metrics.md")).read()
        # Rates and quantiles need a few scrapes; checkpoints come every 50
        # steps.
        missing = without_data(web, exprs, 90)
        for title, expr in missing:
            print(f"no data: {title}: {expr}")
        # Per-rank panels must show both ranks.
        ranks = {r["metric"].get("rank") for r in query(
            web, 'sum by (rank) (rate(ptrain_comm_seconds_total'
                 '{job="shakespeare-char"}[1m]))')}
        print(f"{len(exprs) - len(missing)} of {len(exprs)} dashboard queries "
              f"returned data; ranks seen: {sorted(ranks)}")
        # The communication panel, by rank, group and op: ring attention's
        # group and the gradients' both there.
        comm = [e for t, e in exprs if "by rank, group and op" in t]
        groups = {r["metric"].get("group")
                  for e in comm for r in query(web, e)}
        print(f"communication panel groups: {sorted(groups)}")
        groups_ok = len(comm) == 1 and {"cp", "dp"} <= groups
        gpu_bad = []
        for title, expr in gpu_exprs:
            names = re.findall(r"\bptrain_\w+", expr)
            undocumented = [n for n in names if f"`{n}`" not in documented]
            try:
                result = query(web, expr)
            except (RuntimeError, urllib.error.HTTPError) as e:
                result = None
                print(f"invalid: {title}: {e}")
            if result is None or result or undocumented:
                gpu_bad.append(title)
                print(f"GPU panel wrong: {title}: {expr} (undocumented "
                      f"{undocumented}, result {result})")
        print(f"{len(gpu_exprs) - len(gpu_bad)} of {len(gpu_exprs)} GPU-only "
              f"queries valid, documented and empty on a CPU job")
        ok = not missing and ranks == {"0", "1"} and not gpu_bad and groups_ok
        passed = len(exprs) - len(missing) + (ranks == {"0", "1"}) + \
            len(gpu_exprs) - len(gpu_bad) + groups_ok
        failed = len(missing) + (ranks != {"0", "1"}) + len(gpu_bad) + \
            (not groups_ok)
        print(f"{passed} passed, {failed} failed")
        return 0 if ok else 1
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait()
        os.killpg(worker.pid, 9)
        worker.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
