#!/usr/bin/env bash
# Generates a Python client from the OpenAPI document a real `pullman serve` serves (on an
# embedded PostgreSQL), as an API user would, and checks that it is usable (issue #26):
#   1. openapi-python-client (pinned) generates the package `pullman_client` and prints no warning
#      (an unsupported content type or an unparsable schema would leave pieces out);
#   2. `mypy --strict` (pinned) passes on program.py and the generated package together;
#   3. program.py runs against the server: create → claim → complete, and the order is in the
#      log as succeeded, all through the generated types (WorkOrder, Targeting, WorkOrderPage…).
#
# Builds nothing: uses ${PULLMAN_BIN:-target/debug/pullman}. Installs the tools (pinned) into a
# venv under ${XDG_CACHE_HOME:-$HOME/.cache}/pullman-openapi-client on first use (needs python3
# with venv support and PyPI).
#
# Usage: e2e/openapi/client.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
# shellcheck source=../lib/serve.sh
. "$root/e2e/lib/serve.sh"

# The generator, the checker and the generated client's runtime dependencies.
PINS=(openapi-python-client==0.29.1 mypy==2.4.1 httpx==0.28.1 attrs==26.1.0)
serve_bin

venv="${XDG_CACHE_HOME:-$HOME/.cache}/pullman-openapi-client"
stamp="$venv/pins"
if [ "$(cat "$stamp" 2>/dev/null)" != "${PINS[*]}" ]; then
  echo "==> installing ${PINS[*]} into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${PINS[@]}"
  echo "${PINS[*]}" >"$stamp"
fi
# The generator runs ruff (a dependency of it) from PATH to format what it writes.
export PATH="$venv/bin:$PATH"

serve_work openapi-client

admin_token="client-admin-$(python3 -c 'import secrets; print(secrets.token_hex(24))')"
PULLMAN_ADMIN_TOKEN="$admin_token" serve_start "$bin" "$work"
curl -sf "$base/api/v1/openapi.json" -o "$work/openapi.json"

echo "==> openapi-python-client: generating pullman_client from the served document"
(cd "$work" && openapi-python-client generate --path openapi.json --output-path pullman_client \
  --meta none --config "$here/generator.yaml") >"$work/generate.log" 2>&1 \
  || { cat "$work/generate.log" >&2; echo "the client could not be generated" >&2; exit 1; }
if grep -qi 'warning' "$work/generate.log"; then
  cat "$work/generate.log" >&2
  echo "openapi-python-client warned about the document" >&2
  exit 1
fi
echo "    $(ls "$work/pullman_client/models" | grep -vc '^__') model modules"

echo "==> mypy --strict on program.py and the generated client"
cp "$here/program.py" "$work/"
(cd "$work" && mypy --config-file "$here/mypy.ini" --cache-dir "$work/.mypy_cache" program.py)

echo "==> program.py against the server: create → claim → complete"
(cd "$work" && python program.py "$base" "$admin_token") \
  || { tail -20 "$work/serve.log" >&2; echo "the generated client's program failed" >&2; exit 1; }
