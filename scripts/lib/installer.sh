# Sourced by the setup scripts: `installer_init VENV [compile|no-compile]` once, then `pkg_install ARGS...`
# and `pkg_uninstall ARGS...` install into (remove from) VENV's Python.
#
# `compile` (the default) byte-compiles what is installed. This project's machines set
# PYTHONDONTWRITEBYTECODE=1, so no process writes a .pyc: without compiled files every Ray actor, vLLM
# engine and test subprocess would compile its imports again. `no-compile` is for an environment whose
# users compile into a folder of their own: the MindSpeed-RL suite's processes run with
# PYTHONPYCACHEPREFIX (tests/test_mindspeed_rl_suite.py), which makes Python ignore the __pycache__
# folders beside the sources, so compiling all of .venv-mindspeed at setup (~57 CPU-s) was never used.
#
# Why uv: pip downloads and installs one wheel after another and resolves slowly; uv downloads in
# parallel and links from its cache. From empty caches on a 2-core machine the three environments took
# 256 s with pip and 209 s with uv; both spend most of it byte-compiling (docs/benchmarks.md, "Setup with
# uv"). It installs the same versions: it reads pip's indexes, wheel folders and constraints
# (scripts/lib/uv_args_from_pip.py) and picks the best version across them, as pip does.
#
# uv is installed with pip into VENV (or RLHF_EXT_UV names a uv binary). Where it cannot be had, or
# with RLHF_EXT_INSTALLER=pip, everything is installed with pip, as before. pip stays in every VENV
# either way: tests install throwaway distributions with `python -m pip install --target`.
_INSTALLER_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

installer_init() {
  INSTALLER_VENV=$1
  case "${2:-compile}" in
    compile) INSTALLER_COMPILE=1 ;;
    no-compile) INSTALLER_COMPILE=0 ;;
    *) echo "setup: installer_init: expected compile or no-compile, got '$2'" >&2; return 2 ;;
  esac
  INSTALLER_UV=""
  INSTALLER_UV_ARGS=()
  case "${RLHF_EXT_INSTALLER:-uv}" in
    pip) return 0 ;;
    uv) ;;
    *) echo "setup: RLHF_EXT_INSTALLER=${RLHF_EXT_INSTALLER}: expected uv or pip" >&2; return 2 ;;
  esac
  if [ -n "${RLHF_EXT_UV:-}" ] && [ -x "${RLHF_EXT_UV}" ]; then
    INSTALLER_UV=$RLHF_EXT_UV
  elif [ -x "$INSTALLER_VENV/bin/uv" ] \
    || "$INSTALLER_VENV/bin/python" -m pip install -q --disable-pip-version-check "uv>=0.9,<1"; then
    INSTALLER_UV=$INSTALLER_VENV/bin/uv
  else
    echo "setup: could not install uv; installing with pip instead (slower)" >&2
    return 0
  fi
  # without pip's indexes and constraints uv would fetch other builds (torch's CUDA wheels from PyPI)
  local translated
  if ! translated=$("$INSTALLER_VENV/bin/python" "$_INSTALLER_DIR/uv_args_from_pip.py"); then
    echo "setup: could not read pip's configuration for uv; installing with pip instead" >&2
    INSTALLER_UV=""
    return 0
  fi
  mapfile -t INSTALLER_UV_ARGS <<<"$translated"
  # pip's `cert` setting, for uv's downloads (uv reads SSL_CERT_FILE, and has no option for it)
  if [ -z "${SSL_CERT_FILE:-}" ]; then
    local cert
    cert=$("$INSTALLER_VENV/bin/python" "$_INSTALLER_DIR/uv_args_from_pip.py" --cert)
    if [ -n "$cert" ]; then export SSL_CERT_FILE=$cert; fi
  fi
}

pkg_install() {
  if [ -n "$INSTALLER_UV" ]; then
    local compile=() rc=0
    [ "$INSTALLER_COMPILE" = 1 ] && compile=(--compile-bytecode)  # uv compiles on every core
    "$INSTALLER_UV" pip install -q --python "$INSTALLER_VENV/bin/python" "${compile[@]}" \
      "${INSTALLER_UV_ARGS[@]}" "$@" || rc=$?
    [ "$rc" = 0 ] && return 0
    # pip reads its configuration itself (a proxy, a client certificate: what the translation leaves out)
    echo "setup: uv failed (exit $rc) installing $*; installing it with pip instead" >&2
  fi
  _pip_install "$@"
}

_pip_install() {
  local compile=()
  [ "$INSTALLER_COMPILE" = 1 ] || compile=(--no-compile)  # pip compiles unless told not to
  "$INSTALLER_VENV/bin/python" -m pip --disable-pip-version-check install -q "${compile[@]}" "$@"
}

pkg_uninstall() {
  if [ -n "$INSTALLER_UV" ]; then
    "$INSTALLER_UV" pip uninstall -q --python "$INSTALLER_VENV/bin/python" "$@"
  else
    "$INSTALLER_VENV/bin/python" -m pip --disable-pip-version-check uninstall -q -y "$@"
  fi
}
