#!/usr/bin/env bash
# Regenerates yb_cdc_pb2.py (and its .pyi stub) from yb_cdc.proto, the YugabyteDB CDC-service
# messages the product speaks (airflow_provider_cdc/cdc/sources/yugabyte_cdc/protocol/).
#
# The generated module is committed, so the runtime needs only `protobuf`. It is generated with
# an old-enough protoc (grpcio-tools 1.63.0 -> protobuf gencode 5.26.1) because protobuf's runtime
# refuses gencode newer than itself: 5.26.1 gencode loads on every runtime from 5.26.1 through 7.x.
#
# Usage: scripts/generate_yb_protocol.sh            (uses a throwaway venv under .work/)
#        PYTHON=/path/to/python scripts/generate_yb_protocol.sh   (a Python with grpcio-tools)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROTO_DIR="airflow_provider_cdc/cdc/sources/yugabyte_cdc/protocol"
GRPCIO_TOOLS_VERSION="${GRPCIO_TOOLS_VERSION:-1.63.0}"

cd "$ROOT"

if [[ -z "${PYTHON:-}" ]]; then
  VENV="$ROOT/.work/grpcio-tools-$GRPCIO_TOOLS_VERSION"
  if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet "grpcio-tools==$GRPCIO_TOOLS_VERSION"
  fi
  PYTHON="$VENV/bin/python"
fi

# The proto path is the repository root, so the descriptor's file name is the full relative path
# (unique in protobuf's global descriptor pool) and the output lands beside the .proto.
"$PYTHON" -m grpc_tools.protoc \
  --proto_path=. \
  --python_out=. \
  --pyi_out=. \
  "$PROTO_DIR/yb_cdc.proto"

# Generated code is not held to the project's lint rules.
for generated in "$PROTO_DIR/yb_cdc_pb2.py" "$PROTO_DIR/yb_cdc_pb2.pyi"; do
  { echo "# ruff: noqa"; cat "$generated"; } > "$generated.tmp"
  mv "$generated.tmp" "$generated"
done

echo "generated $PROTO_DIR/yb_cdc_pb2.py with grpcio-tools $("$PYTHON" -c 'import importlib.metadata as m; print(m.version("grpcio-tools"))')"
