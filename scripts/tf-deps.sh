#!/usr/bin/env bash
# TensorFlow for the TF example job (make demo ARGS="--framework tf", make test-tf), into the
# project's virtualenv, opt-in: make setup never installs it (about 1.3 GB installed).
#
#   scripts/tf-deps.sh [PYTHON] [REQUIREMENT]    (defaults: .venv/bin/python tensorflow-cpu==2.21.0)
#
# It must not change any package already installed (torch 2.13.0 and every pin of
# requirements*.txt stay as they are): pip gets every installed version as a constraint, so
# a TensorFlow that needed another numpy, protobuf, ... fails here naming the conflict
# instead of replacing it. tensorflow-cpu 2.21.0 adds only new packages (TensorFlow, Keras,
# grpcio, protobuf, h5py, ...). Does nothing when that version is already installed.
set -euo pipefail

PY="${1:-.venv/bin/python}"
REQ="${2:-tensorflow-cpu==2.21.0}"
NAME="${REQ%%==*}"
VERSION="${REQ#*==}"

have=$("$PY" -c "import importlib.metadata as m
try: print(m.version('$NAME'))
except m.PackageNotFoundError: print('')")
if [ "$have" = "$VERSION" ]; then
    echo "tf-deps: $NAME $VERSION is already installed in $("$PY" -c 'import sys; print(sys.prefix)')"
    exit 0
fi

constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
# Every installed distribution pinned to its version (editable and URL installs have no
# "==" line and are left out: pip could not replace them through a version anyway).
"$PY" -m pip freeze --exclude-editable 2>/dev/null | grep '==' > "$constraints" || true

echo "tf-deps: installing $REQ into $("$PY" -c 'import sys; print(sys.prefix)') (about 270 MB" \
     "to download, 1.3 GB installed; the installed packages stay as they are)"
start=$SECONDS
"$PY" -m pip install --disable-pip-version-check --progress-bar on -c "$constraints" "$REQ"
echo "tf-deps: $REQ installed in $((SECONDS - start)) s"
