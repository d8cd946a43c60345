#!/usr/bin/env bash
# Soak and failover of `tessera serve` on loopback (issue 15): a GPT-2 and a
# BERT server, each on the terminal + 2 `tessera worker` daemons; CLIENTS clients (4),
# REQUESTS mixed requests (5% invalid); a random daemon killed about every
# 100 requests and restarted. Fails unless 0 valid requests fail, every
# answer equals its single-device reference, every invalid one gets 400,
# RSS grows <= 10% after warm-up and both servers exit 0 on SIGTERM.
#   bash bench/soak.sh [REQUESTS] [BUILD_DIR] [CLIENTS]      (default 1000, build, 4)
# SOAK_SERVE_ARGS adds flags to both servers (e.g. "--max-batch 8").
set -euo pipefail
cd "$(dirname "$0")/.."
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
exec python3 bench/soak.py "${2:-build}/bin/tessera" "${1:-1000}" tests/data "${3:-4}"
