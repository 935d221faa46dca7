#!/usr/bin/env bash
# Fetch the benchmark data csd-bench reads (needs internet). Usage:
#   bash experiments/download_data.sh [DATA_DIR]     (default: ./data)
# Produces the paths the dataset configs expect:
#   DATA_DIR/coco/annotations/captions_val2017.json   prompts (conf/dataset/coco2017.yaml)
#   DATA_DIR/coco/val2017/*.jpg                        FID reference images (5000, ~0.8 GB)
#   DATA_DIR/geneval/evaluation_metadata.jsonl         GenEval prompts (conf/dataset/geneval.yaml)
# Inception (FID) and CLIP weights are not fetched here: torchmetrics / open_clip download them on
# first use into $TORCH_HOME and the Hugging Face cache; see the README's "Offline use" for offline machines.
set -euo pipefail
DATA_DIR=${1:-data}
COCO_URL=http://images.cocodataset.org
GENEVAL_URL=https://raw.githubusercontent.com/djghosh13/geneval/main/prompts/evaluation_metadata.jsonl

mkdir -p "$DATA_DIR/coco" "$DATA_DIR/geneval"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ ! -f "$DATA_DIR/coco/annotations/captions_val2017.json" ]; then
  curl -L --fail -o "$tmp/ann.zip" "$COCO_URL/annotations/annotations_trainval2017.zip"
  unzip -q -o "$tmp/ann.zip" annotations/captions_val2017.json -d "$DATA_DIR/coco"
fi
if [ ! -d "$DATA_DIR/coco/val2017" ]; then
  curl -L --fail -o "$tmp/val2017.zip" "$COCO_URL/zips/val2017.zip"
  unzip -q "$tmp/val2017.zip" -d "$DATA_DIR/coco"
fi
if [ ! -f "$DATA_DIR/geneval/evaluation_metadata.jsonl" ]; then
  curl -L --fail -o "$DATA_DIR/geneval/evaluation_metadata.jsonl" "$GENEVAL_URL"
fi
echo "data ready under $DATA_DIR"
