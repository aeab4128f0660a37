#!/bin/sh
# Makes the stack's CA, one certificate per coordinator and per region, and
# the admin token, once: a volume that already holds them is left alone.
set -eu
pki=/etc/meridian/pki
if [ -f "$pki/admin-token" ]; then
  echo "pki: already made"
  exit 0
fi
meridian certs ca --dir "$pki" --name "meridian compose CA"
for id in 1 2 3; do
  meridian certs issue --dir "$pki" --node "$id" --host "coordinator-$id" --days 90
done
for region in mumbai hyderabad; do
  meridian certs issue --dir "$pki" --region "$region" --days 90
done
# 128 random bits; the token never appears on a command line or in a log.
umask 077
od -An -N16 -tx1 /dev/urandom | tr -d ' \n' > "$pki/admin-token"
# The CA's key signs new certificates only: nothing in the stack needs it.
rm -f "$pki/ca-key.pem"
echo "pki: CA, 3 node and 2 region certificates, admin token"
