#!/usr/bin/env bash
# Installs what Tessera needs and is missing, idempotently, from Debian packages and PyPI only.
# CUDA 13 is expected at /usr/local/cuda (optional: without nvcc the build is CPU-only).
set -euo pipefail

debs=(g++ pkg-config python3 libeigen3-dev libboost1.81-dev libboost-json1.81-dev libboost-test1.81-dev libpcre2-dev zlib1g-dev)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install_deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

pip_install() {
  python3 -m pip install -q "$@" 2>/dev/null || python3 -m pip install -q --break-system-packages "$@"
}
if ! python3 -m pip --version >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-pip >/dev/null
fi
meson_ok=$(python3 - <<'PY' 2>/dev/null || echo no
import shutil, subprocess
m = shutil.which("meson")
v = subprocess.run([m, "--version"], capture_output=True, text=True).stdout.strip() if m else "0"
print("yes" if tuple(int(x) for x in v.split(".")[:2]) >= (1, 4) else "no")
PY
)
[ "$meson_ok" = yes ] || pip_install 'meson>=1.4'
command -v ninja >/dev/null 2>&1 || pip_install ninja
# The official OpenAI Python SDK: the server's conformance and load tests drive `tessera serve` with it.
python3 -c "import openai" 2>/dev/null || pip_install openai
for req in ${TESSERA_PY_REQUIREMENTS:-}; do
  python3 -c "import ${req%%=*}" 2>/dev/null || pip_install "$req"
done

# The DeepSeek tokenizer.json for the embedded default (cached; see docs/tokenizer.md). Not fatal offline.
bash "$(dirname "$0")/fetch_tokenizer.sh" >/dev/null || echo "install_deps: tokenizer.json not fetched (see docs/tokenizer.md)" >&2
