#!/usr/bin/env bash
# Fetch the benchmark data csd-bench reads (needs internet). Usage:
#   bash experiments/download_data.sh [DATA_DIR]     (default: ./data)
# Produces the paths the dataset configs expect:
#   DATA_DIR/coco/annotations/captions_val2017.json   prompts (conf/dataset/coco2017.yaml)
#   DATA_DIR/coco/val2017/*.jpg                        FID reference images (5000, ~0.8 GB)
#   DATA_DIR/geneval/evaluation_metadata.jsonl         GenEval prompts (conf/dataset/geneval.yaml)
#   DATA_DIR/parti/PartiPrompts.tsv                    PartiPrompts (conf/dataset/partiprompts.yaml)
#   DATA_DIR/dpg_bench/dpg_bench.csv                   DPG-Bench prompts and questions (conf/dataset/dpg_bench.yaml)
#   DATA_DIR/coco2014/annotations/captions_val2014.json   COCO 2014 30k prompts (conf/dataset/coco2014_30k.yaml)
#   DATA_DIR/coco2014/val2014/*.jpg                    its FID reference images (40504, ~6.2 GB): only with
#                                                      FETCH_VAL2014=1 in the environment
# Inception (FID) and CLIP weights are not fetched here: torchmetrics / open_clip download them on
# first use into $TORCH_HOME and the Hugging Face cache; see the README's "Offline use" for offline machines.
set -euo pipefail
DATA_DIR=${1:-data}
COCO_URL=http://images.cocodataset.org
GENEVAL_URL=https://raw.githubusercontent.com/djghosh13/geneval/main/prompts/evaluation_metadata.jsonl
PARTI_URL=https://raw.githubusercontent.com/google-research/parti/main/PartiPrompts.tsv
DPG_URL=https://raw.githubusercontent.com/TencentQQGYLab/ELLA/main/dpg_bench/dpg_bench.csv

mkdir -p "$DATA_DIR/coco" "$DATA_DIR/geneval" "$DATA_DIR/parti" "$DATA_DIR/dpg_bench" "$DATA_DIR/coco2014"
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
if [ ! -f "$DATA_DIR/parti/PartiPrompts.tsv" ]; then
  curl -L --fail -o "$DATA_DIR/parti/PartiPrompts.tsv" "$PARTI_URL"
fi
if [ ! -f "$DATA_DIR/dpg_bench/dpg_bench.csv" ]; then
  curl -L --fail -o "$DATA_DIR/dpg_bench/dpg_bench.csv" "$DPG_URL"
fi
if [ ! -f "$DATA_DIR/coco2014/annotations/captions_val2014.json" ]; then
  curl -L --fail -o "$tmp/ann2014.zip" "$COCO_URL/annotations/annotations_trainval2014.zip"
  unzip -q -o "$tmp/ann2014.zip" annotations/captions_val2014.json -d "$DATA_DIR/coco2014"
fi
if [ "${FETCH_VAL2014:-0}" = 1 ] && [ ! -d "$DATA_DIR/coco2014/val2014" ]; then
  curl -L --fail -o "$tmp/val2014.zip" "$COCO_URL/zips/val2014.zip"
  unzip -q "$tmp/val2014.zip" -d "$DATA_DIR/coco2014"
fi
echo "data ready under $DATA_DIR"
