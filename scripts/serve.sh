#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs Tessera on its embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
exec build/tessera version
