#!/usr/bin/env bash
# A local certificate authority and one certificate per Forkyard service, for mesh mTLS.
#   scripts/certs.sh [DIR]    (default: $FORKYARD_STATE_DIR/certs, else .forkyard/certs)
# Each service certificate is good for localhost / 127.0.0.1 / its service name, as a
# server and as a client (internal services call each other). `client` is for the CLI,
# grpcurl and tests. Existing files are kept; delete DIR to start over. Local use only:
# in production, certificates come from your own CA (cert-manager, Vault, ...).
set -euo pipefail
DIR=${1:-${FORKYARD_STATE_DIR:-.forkyard}/certs}
DAYS=${CERT_DAYS:-825}
SERVICES=(gateway sandbox-provisioner agent-runner budget-ledger janitor temporal client)
command -v openssl >/dev/null || { echo "openssl is missing (apt-get install openssl)"; exit 1; }
mkdir -p "$DIR"
chmod 700 "$DIR"
cd "$DIR"

if [ ! -s ca.pem ] || [ ! -s ca.key ]; then
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ca.key 2>/dev/null
  openssl req -x509 -new -key ca.key -sha256 -days "$DAYS" -subj "/CN=forkyard local mesh CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out ca.pem
  echo "made CA $DIR/ca.pem"
fi

for s in "${SERVICES[@]}"; do
  [ -s "$s.pem" ] && [ -s "$s.key" ] && continue
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$s.key" 2>/dev/null
  openssl req -new -key "$s.key" -subj "/CN=$s" -out "$s.csr"
  cat >"$s.ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=DNS:localhost,DNS:$s,IP:127.0.0.1
EXT
  openssl x509 -req -in "$s.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days "$DAYS" -sha256 \
    -extfile "$s.ext" -out "$s.pem" 2>/dev/null
  rm -f "$s.csr" "$s.ext"
  echo "made $DIR/$s.pem"
done
chmod 600 ./*.key
