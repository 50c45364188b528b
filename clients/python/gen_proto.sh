#!/bin/sh
# Regenerates hvdd/_proto/hvdd_pb2.py from the daemon's ipc/ipcpb/hvdd.proto.
# Run from anywhere: clients/python/gen_proto.sh (the project Makefile's `make proto` calls it).
# Needs protoc 3.21.x (the runtime floor in pyproject.toml is protobuf>=4.21, its Python side).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
protoc --proto_path="$root/ipc/ipcpb" --python_out="$out" "$root/ipc/ipcpb/hvdd.proto"
cp "$out/hvdd_pb2.py" "$here/hvdd/_proto/hvdd_pb2.py"
echo "wrote $here/hvdd/_proto/hvdd_pb2.py" >&2
