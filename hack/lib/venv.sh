# shellcheck shell=bash
# Shared by hack/try.sh and hack/test.sh: root or sudo for apt, and the project's virtual
# environment (.venv in the checkout), made with the machine's python3. Debian 12 and Ubuntu 24.04
# refuse `pip install` outside a venv (PEP 668), and split venv support out of python3
# (python3-venv), so it is installed when missing.

# as_root CMD...: run CMD as root (directly, or through sudo for a normal user).
as_root() {
  if ((EUID == 0)); then
    "$@"
  elif command -v sudo >/dev/null; then
    sudo "$@"
  else
    echo "$0: '$*' needs root: run as root or install sudo" >&2
    return 1
  fi
}

# apt_install PKG...: install the Debian packages not installed yet (one apt-get update first).
apt_install() {
  local missing=() p
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  ((${#missing[@]})) || return 0
  echo "$0: installing ${missing[*]}" >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
}

# ensure_venv: .venv with an up-to-date pip, made with python3 (3.11 or newer).
ensure_venv() {
  local python=${PYTHON:-python3}
  if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "$0: cdiplug needs Python 3.11 or newer as $python" >&2
    return 1
  fi
  if [[ ! -x .venv/bin/python ]]; then
    if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
      local version
      version=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
      apt_install "python${version}-venv"
    fi
    "$python" -m venv .venv
  fi
  .venv/bin/python -m pip install -q --upgrade pip
}
