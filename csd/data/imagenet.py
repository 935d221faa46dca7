"""ImageNet class ids as prompts, for class-conditional models (``dataset=imagenet_classes``, docs/MODELS.md, "LlamaGen").

The pipeline passes a prompt's text to the model adapter, so a class travels as its id written in decimal
(``"207"``); its name (torchvision's ImageNet-1k category list, shipped in ``imagenet_classes.txt``) goes to the
prompt's ``meta`` for records and captions. A class-conditional adapter refuses any other text
(``csd.adapters.llamagen.class_id``), and the config check pairs class-conditional models with this dataset before any
model loads.
"""

from __future__ import annotations

from pathlib import Path

from csd.prompts import Prompt

CLASS_NAMES_FILE = Path(__file__).with_name("imagenet_classes.txt")


def class_names() -> list[str]:
    """The 1000 ImageNet-1k class names, in class-id order."""
    return CLASS_NAMES_FILE.read_text(encoding="utf-8").splitlines()


def imagenet_class_prompts(n_prompts: int | None = None) -> list[Prompt]:
    """Classes ``0 .. n_prompts - 1`` (all 1000 when None), one prompt each: text ``str(id)``, meta id and name."""
    names = class_names()
    return [Prompt(f"class-{i:04d}", str(i), {"class_id": i, "class_name": name})
            for i, name in enumerate(names[:n_prompts])]
