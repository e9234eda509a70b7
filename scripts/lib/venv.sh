# Sourced by scripts/setup.sh and scripts/setup_vllm.sh (from the repository root): create or reuse a virtual
# environment and run its install function once per content of pyproject.toml, the calling script and this file.
# usage: ensure_venv VENV SCRIPT INSTALL_FUNCTION [FILE...]   (INSTALL_FUNCTION gets the environment's python; FILEs:
# more inputs of the install, keyed into the stamp too; prints nothing on stdout but the python's path, last, for
# callers that take `tail -n 1`)
ensure_venv() {
  local venv="$1" script="$2" install="$3"
  shift 3
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  local stamp
  stamp="$venv/.tokenpo-$(cat pyproject.toml "$script" scripts/lib/venv.sh "$@" | sha1sum | cut -c1-12)"
  if [ ! -f "$stamp" ]; then
    "$install" "$venv/bin/python"
    rm -f "$venv"/.tokenpo-*
    touch "$stamp"
  fi
  echo "$venv/bin/python"
}
