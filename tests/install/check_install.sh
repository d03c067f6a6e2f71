#!/usr/bin/env bash
# Installs the built tree into a temporary prefix and builds + runs tests/install/consumer against it
# through find_package(dsv4). Usage: check_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1" source="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$source/tests/install/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
"$work/consumer/consumer"
