#!/usr/bin/python3
"""deploy/grafana's provisioning files and the dashboards they load, checked
without a Grafana (Debian has none): each file is provisioning format
version 1; the data source is a default Prometheus; the dashboard provider
reads the checkout's dashboards/ folder; every dashboard there is valid
JSON with its own uid and title, picks its data source through a
`datasource` variable of type prometheus (so the provisioned default is
used unchanged), and every panel queries through that variable.

    grafana_provisioning_test.py SOURCE_DIR
"""
import glob
import json
import os
import sys

import yaml


def main():
    src = sys.argv[1]
    prov = os.path.join(src, "deploy/grafana/provisioning")
    checks = []
    with open(os.path.join(prov, "datasources/ptrain.yml")) as f:
        ds = yaml.safe_load(f)
    checks.append(("datasources: apiVersion 1", ds.get("apiVersion") == 1))
    sources = ds.get("datasources", [])
    checks.append(("one default Prometheus data source",
                   len(sources) == 1 and sources[0].get("type") == "prometheus"
                   and sources[0].get("isDefault") is True
                   and sources[0].get("url")))
    with open(os.path.join(prov, "dashboards/ptrain.yml")) as f:
        dp = yaml.safe_load(f)
    checks.append(("dashboards: apiVersion 1", dp.get("apiVersion") == 1))
    providers = dp.get("providers", [])
    checks.append(("one file provider reading .../dashboards",
                   len(providers) == 1 and providers[0].get("type") == "file"
                   and os.path.basename(
                       providers[0]["options"]["path"].rstrip("/"))
                   == "dashboards"))
    files = sorted(glob.glob(os.path.join(src, "dashboards/*.json")))
    checks.append(("the job and cluster dashboards are there",
                   {os.path.basename(f) for f in files}
                   >= {"ptrain-job.json", "ptrain-cluster.json"}))
    uids = []
    for path in files:
        name = os.path.basename(path)
        with open(path) as f:
            d = json.load(f)
        uids.append(d.get("uid"))
        var = [v for v in d.get("templating", {}).get("list", [])
               if v.get("name") == "datasource"]
        checks.append((f"{name}: a title and a uid", d.get("title") and d.get("uid")))
        checks.append((f"{name}: a datasource variable of type prometheus",
                       len(var) == 1 and var[0].get("type") == "datasource"
                       and var[0].get("query") == "prometheus"))
        panels = d.get("panels", [])
        checks.append((f"{name}: every panel queries through it",
                       panels and all(p.get("datasource", {}).get("uid")
                                      == "${datasource}" and p.get("targets")
                                      for p in panels)))
        ids = [p.get("id") for p in panels]
        checks.append((f"{name}: panel ids unique", len(ids) == len(set(ids))))
    checks.append(("dashboard uids unique", len(uids) == len(set(uids))))
    for name, ok in checks:
        print(("ok   " if ok else "FAIL ") + name)
    failed = sum(1 for _, ok in checks if not ok)
    print(f"{len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
