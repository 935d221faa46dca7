#!/usr/bin/env bash
# Reproduce the committed toy results under results/ (CPU: toy_paper 53 min on one thread, the ablation ~5 min):
# the paper table on the toy (toy_paper) and the CSD lambda/delta ablation, with speed-ups against
# toy_paper's AR run. Same seeds -> same tokens (tests/pipeline/test_results.py checks a sample of them).
# Finished images are resumed, not redone: after retraining the toy model, delete
# results/toy_paper and results/ablation_lambda_delta first.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
python run.py experiment=toy_paper logger=disabled hydra.sweep.dir=results/toy_paper
python run.py experiment=ablation_lambda_delta model=toy dataset=toy dataset.n_prompts=16 device=cpu logger=disabled \
  'eval.report.extra_runs=[results/toy_paper/0_ar]' hydra.sweep.dir=results/ablation_lambda_delta
# the matched-compression study (docs/EVALUATION.md#matched-compression-study; docs/RESULTS.md "Is entropy the right
# signal?"): about 50 min on one thread; resumes after an interruption
python run.py experiment=entropy_study hydra.run.dir=results/entropy_study
# drafters on the toy (docs/RESULTS.md "Drafters on the toy"), all at batch 1 on the 400 held-out prompts: SJD and
# LANTERN on the shipped EAGLE head (~35 min), SJD on the head's static binary tree (~10 min) ...
python run.py experiment=toy_drafters logger=disabled hydra.sweep.dir=results/toy_drafters
python run.py experiment=toy_drafters logger=disabled hydra.mode=RUN method=sjd drafter=eagle drafter.window=5 \
  drafter.tree=binary run_dir=results/toy_drafters/4_sjd_tree
# ... SSD (lossy) and Hawk (lossless) on the shipped spatial heads, PJD (c = 4, window 16), VVS's skipping on the
# head's tree (lossy), then the report over every run of the directory
for r in 0 1 2; do
  python run.py experiment=toy_drafters logger=disabled hydra.mode=RUN method=ssd_r$r run_dir=results/toy_drafters/ssd_r$r
done
python run.py experiment=toy_drafters logger=disabled hydra.mode=RUN method=hawk drafter=hawk \
  drafter.heads=csd/toy/assets/spatial_heads.pt drafter.window=64 drafter.width=2 drafter.depth=5 \
  run_dir=results/toy_drafters/5_hawk
python run.py experiment=toy_drafters logger=disabled hydra.mode=RUN method=sjd drafter=pjd drafter.window=16 \
  drafter.context=4 run_dir=results/toy_drafters/6_pjd
for s in uniform similarity; do
  python run.py experiment=toy_drafters logger=disabled hydra.mode=RUN method=sjd drafter=eagle drafter.window=5 \
    drafter.tree=binary drafter.skip=$s run_dir=results/toy_drafters/7_vvs_$s
done
python run.py experiment=toy_drafters logger=disabled hydra.mode=RUN stage=report sweep_dir=results/toy_drafters
# the second and third embedded models, model=toy_textured and model=toy_textured_outline (docs/RESULTS.md "A second
# toy: realistic entropy"): on each, the matched-compression study (about 1 h 30 on one thread; resumes), then the
# spatial table (PJD with SJD's and CSD's rules) with its reference runs and the report over the directory; then the
# entropy maps (the toy against the textured toy, the textured toy against the outline toy)
for m in textured textured_outline; do
  python run.py experiment=entropy_study_$m logger=disabled hydra.run.dir=results/entropy_study_$m
  python run.py experiment=toy_spatial_$m logger=disabled hydra.sweep.dir=results/toy_spatial_$m
  for ref in "ar:method=ar" "sjd:method=sjd" "sjd_pac:method=sjd_pac engine.batch_size=1" "zipar:method=sjd drafter=zipar" \
      "eagle:method=sjd drafter=eagle drafter.window=5"; do
    # shellcheck disable=SC2086
    python run.py experiment=toy_spatial_$m logger=disabled hydra.mode=RUN ${ref#*:} \
      run_dir=results/toy_spatial_$m/ref_${ref%%:*}
  done
  python run.py experiment=toy_spatial_$m logger=disabled hydra.mode=RUN stage=report sweep_dir=results/toy_spatial_$m
done
python -m experiments.entropy_map results/toy_paper/0_ar results/entropy_study_textured/ar --labels toy toy_textured
python -m experiments.entropy_map results/entropy_study_textured/ar results/entropy_study_textured_outline/ar \
  --labels toy_textured toy_textured_outline --out results/toy_textured_outline/entropy_map
