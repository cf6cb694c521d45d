#!/usr/bin/env bash
# Nightly drift audit of one deployment: wraps `vllm-perimeter audit` for cron (or a CronJob).
#
#   BASELINE   baseline directory or signed evidence pack (default /etc/vllm-perimeter/baseline)
#   TARGET     the perimeter proxy's URL (default https://llm.internal.example)
#   UPSTREAM   vLLM itself, reachable from here (optional; sweeps the route surface behind the proxy)
#   NGINX_CONF the deployed NGINX main config (optional; compared with the baseline's)
#   KEYS_DIR   one file per role (user, service, operator) holding that role's API key
#   OUT_DIR    reports; METRICS the node_exporter textfile to write
#
# Exit codes are audit's: 0 clean, 1 drift or findings >= high, 2 bad input, 3 unreachable.
set -uo pipefail

BASELINE="${BASELINE:-/etc/vllm-perimeter/baseline}"
TARGET="${TARGET:-https://llm.internal.example}"
UPSTREAM="${UPSTREAM:-}"
NGINX_CONF="${NGINX_CONF:-}"
KEYS_DIR="${KEYS_DIR:-/etc/vllm-perimeter/keys}"
OUT_DIR="${OUT_DIR:-/var/lib/vllm-perimeter/audit}"
METRICS="${METRICS:-/var/lib/node_exporter/textfile/vllm_perimeter.prom}"
PUBLIC_KEY="${PUBLIC_KEY:-}"        # expected signer when BASELINE is an evidence pack
VP="${VP:-vllm-perimeter}"

stamp=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT_DIR"
args=(audit "$BASELINE" "$TARGET" --format json -o "$OUT_DIR/audit-$stamp.json" --metrics "$METRICS"
      --fail-on high -q)
for role in user service operator; do
  [ -r "$KEYS_DIR/$role" ] && args+=(--key "$role=file:$KEYS_DIR/$role")   # keys by reference only
done
[ -n "$UPSTREAM" ] && args+=(--upstream-url "$UPSTREAM")
[ -n "$NGINX_CONF" ] && args+=(--nginx-config "$NGINX_CONF")
[ -n "$PUBLIC_KEY" ] && args+=(--public-key "$PUBLIC_KEY")

"$VP" "${args[@]}"
rc=$?
ln -sfn "audit-$stamp.json" "$OUT_DIR/latest.json"
find "$OUT_DIR" -name 'audit-*.json' -mtime +30 -delete
case $rc in
  0) echo "vllm-perimeter audit: clean" ;;
  1) echo "vllm-perimeter audit: DRIFT or findings, see $OUT_DIR/audit-$stamp.json" >&2 ;;
  2) echo "vllm-perimeter audit: bad baseline or arguments" >&2 ;;
  3) echo "vllm-perimeter audit: target unreachable" >&2 ;;
esac
exit $rc
