#!/bin/sh
# Makes the Secrets the manifests mount, with `meridian certs` and kubectl:
#   deploy/k8s/make-secrets.sh PKI_DIR NAMESPACE REGION
# The CA (PKI_DIR/ca.pem, ca-key.pem) is made when missing; keep ca-key.pem
# off the clusters. Run it against each region's cluster (kubectl context)
# with that region's name; the coordinators' Secrets go to every cluster
# that runs coordinators. Nothing secret is printed.
set -eu
[ $# -eq 3 ] || { echo "usage: $0 PKI_DIR NAMESPACE REGION" >&2; exit 2; }
pki=$1 ns=$2 region=$3
apply() { kubectl --namespace "$ns" apply -f -; }
[ -f "$pki/ca.pem" ] || meridian certs ca --dir "$pki"

# Coordinators: node N is pod meridian-coordinator-(N-1), dialled by its
# pod DNS name (in this cluster and through a multi-cluster export) and,
# for the admin API, by the meridian-coordinator-admin Service.
for n in 1 2 3; do
  pod="meridian-coordinator-$((n - 1))"
  meridian certs issue --dir "$pki" --node "$n" --days 90 \
    --host "$pod.meridian-coordinator.$ns.svc.cluster.local" \
    --host "$pod.meridian-coordinator.$ns.svc.clusterset.local" \
    --host "meridian-coordinator-admin.$ns.svc" \
    --host "meridian-coordinator-admin.$ns.svc.cluster.local" >/dev/null
done
kubectl create secret generic meridian-coordinator-tls --dry-run=client -o yaml \
  --from-file=ca.pem="$pki/ca.pem" \
  --from-file="$pki/node-1.pem" --from-file="$pki/node-1-key.pem" \
  --from-file="$pki/node-2.pem" --from-file="$pki/node-2-key.pem" \
  --from-file="$pki/node-3.pem" --from-file="$pki/node-3-key.pem" | apply

# The admin token: made once, kept in PKI_DIR (0600) for `meridian ctl`.
if [ ! -f "$pki/admin-token" ]; then
  (umask 077 && od -An -N16 -tx1 /dev/urandom | tr -d ' \n' > "$pki/admin-token")
fi
kubectl create secret generic meridian-admin-token --dry-run=client -o yaml \
  --from-file=token="$pki/admin-token" | apply

meridian certs issue --dir "$pki" --region "$region" --days 90 >/dev/null
kubectl create secret generic meridian-region-tls --dry-run=client -o yaml \
  --type=kubernetes.io/tls \
  --from-file=tls.crt="$pki/region-$region.pem" \
  --from-file=tls.key="$pki/region-$region-key.pem" \
  --from-file=ca.crt="$pki/ca.pem" | apply
# The region's Redis password, in the two shapes its users read.
if [ ! -f "$pki/redis-$region" ]; then
  (umask 077 && od -An -N16 -tx1 /dev/urandom | tr -d ' \n' > "$pki/redis-$region")
fi
password=$(cat "$pki/redis-$region")
printf 'requirepass %s\n' "$password" | kubectl create secret generic meridian-redis-auth \
  --dry-run=client -o yaml --from-file=password="$pki/redis-$region" \
  --from-file=auth.conf=/dev/stdin | apply
echo "secrets applied in namespace $ns: meridian-coordinator-tls, meridian-admin-token, meridian-region-tls, meridian-redis-auth"
