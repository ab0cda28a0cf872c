# shellcheck shell=bash
# A throwaway `pullman serve` on an embedded PostgreSQL, for the e2e scripts that test the HTTP API
# as a client would (e2e/schemathesis/run.sh, e2e/openapi/client.sh). Source it, then:
#   serve_start BIN WORK [serve arguments…]  starts BIN serve (controller off, data in WORK/data,
#       log in WORK/serve.log) on a free local port; sets serve_pid and base (http://127.0.0.1:PORT)
#       and returns once /readyz answers; exits 1 with the log's end if serve dies or is not ready
#       within 60 s. PULLMAN_ADMIN_TOKEN, if set, is its admin token.
#   serve_stop  SIGTERM, up to 10 s to exit, then SIGKILL; safe to call when none was started.
#   serve_bin   sets bin to the pullman binary (PULLMAN_BIN, default target/debug/pullman, from the
#       current directory) as an absolute path; exits 1 saying so when there is none.
#   serve_work NAME  sets work to a fresh /tmp/pullman-NAME.XXXXXX, and traps: on exit serve_stop
#       and work removed; SIGINT and SIGTERM exit 130 (through that exit trap).
# WORK must exist; it is made world-readable, since as root serve runs the embedded PostgreSQL as
# the `postgres` user, which must reach the data directory.
serve_pid=""
base=""

serve_start() {
  local bin="$1" work="$2" port
  shift 2
  chmod 0755 "$work"
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  base="http://127.0.0.1:$port"
  echo "==> pullman serve on $base (data in $work/data, log in $work/serve.log)"
  "$bin" serve --controller off --data-dir "$work/data" --listen "127.0.0.1:$port" "$@" \
    >"$work/serve.log" 2>&1 &
  serve_pid=$!
  for _ in $(seq 120); do
    curl -sf "$base/readyz" >/dev/null 2>&1 && break
    kill -0 "$serve_pid" 2>/dev/null || { cat "$work/serve.log" >&2; echo "serve exited" >&2; exit 1; }
    sleep 0.5
  done
  curl -sf "$base/readyz" >/dev/null || { tail -50 "$work/serve.log" >&2; echo "serve not ready" >&2; exit 1; }
}

serve_bin() {
  bin="${PULLMAN_BIN:-target/debug/pullman}"
  [ -x "$bin" ] || { echo "no pullman binary at $bin (cargo build first, or set PULLMAN_BIN)" >&2; exit 1; }
  bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
}

serve_work() {
  work="$(mktemp -d "/tmp/pullman-$1.XXXXXX")"
  trap serve_cleanup EXIT
  trap 'exit 130' INT TERM
}

serve_cleanup() {
  serve_stop
  rm -rf "$work"
}

serve_stop() {
  if [ -n "$serve_pid" ] && kill -0 "$serve_pid" 2>/dev/null; then
    kill -TERM "$serve_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$serve_pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$serve_pid" 2>/dev/null || true
  fi
}
