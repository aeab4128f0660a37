#!/bin/sh
# Registers the stack's regions and applies its rules through the admin API,
# retrying until the coordinators have a leader.
set -eu
pki=/etc/meridian/pki
export MERIDIAN_COORDINATOR=https://coordinator-1:7902,https://coordinator-2:7902,https://coordinator-3:7902
ctl() { meridian ctl --ca "$pki/ca.pem" --token-file "$pki/admin-token" "$@"; }
for attempt in $(seq 1 60); do
  if ctl regions set mumbai --weight 1 && ctl regions set hyderabad --weight 1; then
    ctl rules apply /etc/meridian/rules.yaml
    exit 0
  fi
  echo "setup: coordinators not ready (attempt $attempt); retrying in 2 s"
  sleep 2
done
echo "setup: gave up after 60 attempts" >&2
exit 1
