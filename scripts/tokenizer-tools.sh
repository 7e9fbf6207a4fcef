# Source next to scripts/tools.sh: the Python reference for the `tokenizer-file` feature's tests.

# Installs tests/wire/tokenizer-requirements.txt (Python's Hugging Face tokenizers) into .venv-wire
# (again when the requirements change) and exports TOKENIZER_WIRE_PYTHON, which the
# `tokenizer::file` tests use to check their ids against Python's. Does not remove .venv-wire:
# other wire tools live there too. Fails when installing fails.
ensure_tokenizer_wire_tools() {
  local stamp=.venv-wire/tokenizer-requirements.txt
  if [ ! -x .venv-wire/bin/python ] || ! cmp -s tests/wire/tokenizer-requirements.txt "$stamp"; then
    echo "installing tests/wire/tokenizer-requirements.txt into .venv-wire" >&2
    [ -x .venv-wire/bin/python ] || python3 -m venv .venv-wire
    .venv-wire/bin/pip install --quiet --disable-pip-version-check -r tests/wire/tokenizer-requirements.txt
    cp tests/wire/tokenizer-requirements.txt "$stamp"
  fi
  TOKENIZER_WIRE_PYTHON="$PWD/.venv-wire/bin/python"
  export TOKENIZER_WIRE_PYTHON
  "$TOKENIZER_WIRE_PYTHON" -c "import tokenizers"
}
