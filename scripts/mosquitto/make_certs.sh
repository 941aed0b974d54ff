#!/bin/sh
# Make a private CA, a broker certificate and (optionally) device client certificates with openssl.
#   make_certs.sh OUT_DIR BROKER_HOSTNAME [DEVICE_ID ...]
# Writes OUT_DIR/ca.crt ca.key server.crt server.key and OUT_DIR/clients/<id>.crt/.key (keys mode 0600).
# Devices get ca.crt (and their own client pair when the broker requires certificates).
set -eu
out=${1:?usage: make_certs.sh OUT_DIR BROKER_HOSTNAME [DEVICE_ID ...]}
host=${2:?broker host name (or IP) devices connect to}
shift 2
mkdir -p "$out/clients"
umask 077
if [ ! -f "$out/ca.key" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj "/CN=edge-agent fleet CA" -keyout "$out/ca.key" -out "$out/ca.crt" 2>/dev/null
fi
case "$host" in
  *[!0-9.]*) san="DNS:$host" ;;
  *) san="IP:$host" ;;
esac
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$host" \
  -keyout "$out/server.key" -out "$out/server.csr" 2>/dev/null
printf "subjectAltName=%s\nextendedKeyUsage=serverAuth\n" "$san" > "$out/server.ext"
openssl x509 -req -in "$out/server.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
  -days 825 -extfile "$out/server.ext" -out "$out/server.crt" 2>/dev/null
for id in "$@"; do
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$id" \
    -keyout "$out/clients/$id.key" -out "$out/clients/$id.csr" 2>/dev/null
  printf "extendedKeyUsage=clientAuth\n" > "$out/clients/$id.ext"
  openssl x509 -req -in "$out/clients/$id.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
    -days 825 -extfile "$out/clients/$id.ext" -out "$out/clients/$id.crt" 2>/dev/null
  rm -f "$out/clients/$id.csr" "$out/clients/$id.ext"
done
rm -f "$out/server.csr" "$out/server.ext"
chmod 644 "$out/ca.crt" "$out/server.crt"
echo "wrote $out/ca.crt, $out/server.crt/.key and $# client certificate(s)"
