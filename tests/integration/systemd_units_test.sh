#!/bin/bash
# deploy/systemd's units pass `systemd-analyze verify` without a word (it
# warns about unknown keys or bad values but still exits 0, so any output
# fails), with ExecStart pointed at the binaries just built, and keep the
# hardening and restart settings operators rely on; ptcoord.env's metrics
# port is the one deploy/prometheus.yml scrapes.
#
#   systemd_units_test.sh SOURCE_DIR PTCOORD PTWORKERD
set -u
src=$1 ptcoord=$2 ptworkerd=$3
if ! command -v systemd-analyze > /dev/null; then
  echo "FAIL: systemd-analyze is not installed (scripts/setup.sh --tests installs systemd)"
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed "s#/opt/ptrain/build/coordinator/ptcoord#$ptcoord#" \
  "$src/deploy/systemd/ptcoord.service" > "$tmp/ptcoord.service"
sed "s#/opt/ptrain/build/worker/ptworkerd#$ptworkerd#" \
  "$src/deploy/systemd/ptworkerd.service" > "$tmp/ptworkerd.service"
failed=0
for unit in ptcoord ptworkerd; do
  out=$(systemd-analyze verify "$tmp/$unit.service" 2>&1)
  if [[ -n $out ]]; then
    echo "FAIL: $unit.service: $out"
    failed=1
  fi
  for want in "User=ptrain" "EnvironmentFile=/etc/ptrain/$unit.env" \
              "Restart=on-failure" "NoNewPrivileges=yes" \
              "ProtectSystem=strict" "ReadWritePaths=/srv/ptrain" \
              "PrivateTmp=yes"; do
    grep -qx "$want" "$tmp/$unit.service" || {
      echo "FAIL: $unit.service lacks $want"
      failed=1
    }
  done
  [[ -f $src/deploy/systemd/$unit.env ]] || {
    echo "FAIL: no environment file template deploy/systemd/$unit.env"
    failed=1
  }
done
grep -qx "StateDirectory=ptrain" "$tmp/ptcoord.service" || {
  echo "FAIL: ptcoord.service has no StateDirectory"
  failed=1
}
# A reload is SIGHUP: ptcoord rereads its users file.
grep -qx 'ExecReload=/bin/kill -HUP $MAINPID' "$tmp/ptcoord.service" || {
  echo "FAIL: ptcoord.service has no reload (SIGHUP) for its users file"
  failed=1
}
# Attempts survive a restart of ptcoord (it re-adopts them).
grep -qx "KillMode=process" "$tmp/ptcoord.service" || {
  echo "FAIL: ptcoord.service would kill running jobs when restarted"
  failed=1
}
# The metrics port of the ptcoord.env template is the one
# deploy/prometheus.yml scrapes, and not Prometheus's own 9090.
metrics=$(grep -o -- '--metrics-listen [^ ]*' "$src/deploy/systemd/ptcoord.env" |
  sed 's/.*://')
if [[ -z $metrics || $metrics == 9090 ]]; then
  echo "FAIL: ptcoord.env's --metrics-listen port '$metrics' is empty or Prometheus's own 9090"
  failed=1
fi
for want in "targets: [\"localhost:$metrics\"]" "url: http://localhost:$metrics/sd"; do
  grep -qF -- "$want" "$src/deploy/prometheus.yml" || {
    echo "FAIL: deploy/prometheus.yml does not scrape ptcoord.env's metrics port ($want)"
    failed=1
  }
done
((failed)) && exit 1
echo "PASS: ptcoord.service and ptworkerd.service verify clean"
