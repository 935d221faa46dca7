"""The embedded toy text-to-image model: domain, tokenizer, LM, scene checker and CLIP.

Shipped weights live in ``csd/toy/assets/`` (reproduced by ``experiments/train_toy.py``).
"""

from pathlib import Path

ASSETS = Path(__file__).parent / "assets"
TOKENIZER_FILE = ASSETS / "tokenizer.safetensors"
LM_DIR = ASSETS / "lm"
CLIP_DIR = ASSETS / "clip"
#: the EAGLE draft head trained on the toy LM (experiments/train_drafter.py; drafter=eagle)
EAGLE_HEAD_FILE = ASSETS / "eagle_head.pt"
#: the SSD spatial heads trained on the toy LM (python -m experiments.train_drafter --kind spatial; drafter=ssd)
SPATIAL_HEADS_FILE = ASSETS / "spatial_heads.pt"
#: the second embedded model (model=toy_textured): the toy LM continued on the textured style of the domain
#: (csd.toy.domain.STYLES); it shares the tokenizer, the CLIP and the scene checker
TEXTURED_DIR = ASSETS / "textured"
TEXTURED_LM_DIR = TEXTURED_DIR / "lm"
#: the EAGLE draft head trained on the textured LM (as EAGLE_HEAD_FILE; csd/toy/MODEL_CARD.md "The textured toy")
TEXTURED_EAGLE_HEAD_FILE = TEXTURED_DIR / "eagle_head.pt"
#: the third embedded model (model=toy_textured_outline): the toy LM continued on the textured_outline style (textured
#: backgrounds and jittered object outlines), with its own EAGLE head; same tokenizer, CLIP and scene checker
OUTLINE_DIR = ASSETS / "textured_outline"
OUTLINE_LM_DIR = OUTLINE_DIR / "lm"
OUTLINE_EAGLE_HEAD_FILE = OUTLINE_DIR / "eagle_head.pt"
