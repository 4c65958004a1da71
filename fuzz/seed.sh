#!/usr/bin/env bash
# Seeds the fuzz corpora with the fixture models and their import dumps.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p fuzz/corpus/import fuzz/corpus/parse_ir
for m in fixtures/*/model.onnx; do cp "$m" "fuzz/corpus/import/$(basename "$(dirname "$m")").onnx"; done
for s in tests/tests/snapshots/*.snap; do sed '1,/^---$/d' "$s" > "fuzz/corpus/parse_ir/$(basename "$s" .snap).txt"; done
