#!/usr/bin/python3
"""The cluster dashboard against a live ptcoord: ptcoord runs a two-rank
job on its own host, a real Prometheus runs deploy/prometheus.yml (its
targets pointed at this ptcoord, its rules file deploy/prometheus/
ptrain-rules.yml) and every query of dashboards/ptrain-cluster.json must
return data. Fails if a metric, a label, a recording rule or a query is
wrong, or if the deploy configuration does not find the ranks.

    cluster_dashboard_test.py PTCOORD PTCTL SOURCE_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

from promtest import start_prometheus, query, wait_for, without_data


def prometheus_config(src, metrics):
    """deploy/prometheus.yml with its ptcoord address replaced by `metrics`,
    scraped every second, its rules file by absolute path."""
    with open(os.path.join(src, "deploy/prometheus.yml")) as f:
        cfg = yaml.safe_load(f)
    cfg["global"]["scrape_interval"] = "1s"
    cfg["global"]["evaluation_interval"] = "1s"
    cfg["rule_files"] = [os.path.join(src, "deploy", r)
                         for r in cfg["rule_files"]]
    for job in cfg["scrape_configs"]:
        for sc in job.get("static_configs", []):
            sc["targets"] = [metrics]
        for sd in job.get("http_sd_configs", []):
            sd["url"] = f"http://{metrics}/sd"
            sd["refresh_interval"] = "1s"
    return cfg


def main():
    ptcoord, ptctl, src = sys.argv[1:4]
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        sys.exit("prometheus is not installed (scripts/setup.sh installs it)")
    tmp = tempfile.mkdtemp(prefix="ptrain_cluster_dash_")
    with open(os.path.join(tmp, "tokens"), "w") as f:
        f.write("dash-test-token\n")
    os.makedirs(os.path.join(tmp, "ck"))
    env = dict(os.environ, OMPI_MCA_mpi_yield_when_idle="1",
               OMP_NUM_THREADS="1")
    coord = subprocess.Popen(
        [ptcoord, "--listen", "127.0.0.1:0", "--state-dir", f"{tmp}/state",
         "--local-slots", "2", "--token-file", f"{tmp}/tokens",
         "--data-root", os.path.join(src, "data"), "--data-root", f"{tmp}/ck",
         "--metrics-listen", "127.0.0.1:0", "--log-level", "warn"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    prom = None
    try:
        read = lambda name: (open(f"{tmp}/state/{name}").read().strip()
                             if os.path.exists(f"{tmp}/state/{name}") else "")
        server = wait_for(lambda: read("address"), 30, "ptcoord's address")
        metrics = wait_for(lambda: read("metrics_address"), 30, "metrics")
        cenv = dict(env, PTCTL_SERVER=server, PTCTL_TOKEN="dash-test-token")
        subprocess.run(
            [ptctl, "submit", os.path.join(src, "examples/shakespeare-char.yaml"),
             "--set", "parallel.dp=2", "--set", "train.steps=100000",
             "--set", "model.n_layer=1", "--set", "model.n_embd=32",
             "--set", "train.eval_every=0", "--set", f"checkpoint.dir={tmp}/ck"],
            env=cenv, capture_output=True, text=True, check=True)
        with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
            yaml.safe_dump(prometheus_config(src, metrics), f)
        prom, web = start_prometheus(prometheus, f"{tmp}/prometheus.yml", tmp)
        dash = json.load(open(os.path.join(src, "dashboards/ptrain-cluster.json")))
        exprs = [(p["title"], t["expr"]) for p in dash["panels"]
                 for t in p["targets"]]
        missing = without_data(web, exprs, 120)
        for title, expr in missing:
            print(f"no data: {title}: {expr}")
        # The slowest-rank panel names one rank of the job.
        slowest = [] if missing else query(web, exprs[4][1])
        one_rank = (len(slowest) == 1 and
                    slowest[0]["metric"].get("rank") in ("0", "1"))
        print(f"{len(exprs) - len(missing)} of {len(exprs)} cluster dashboard "
              f"queries returned data; slowest rank: "
              f"{[s['metric'] for s in slowest]}")
        ok = not missing and one_rank
        print(f"{len(exprs) - len(missing) + one_rank} passed, "
              f"{len(missing) + (not one_rank)} failed")
        return 0 if ok else 1
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait()
        coord.terminate()
        coord.wait()
        subprocess.run(["pkill", "-f", f"{tmp}/state"], check=False)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
