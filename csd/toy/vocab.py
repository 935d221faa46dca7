"""The toy model's token space: a word-level caption vocabulary followed by the image codes.

Sequence layout: ``<bos>``, the caption left-padded with ``<pad>`` to :data:`CAPTION_LEN` words,
``<boi>``, then 256 image tokens (LM id = :data:`N_TEXT` + code). The null caption used for
classifier-free guidance is all ``<pad>``, so conditional and unconditional prompts have the same
length and never need an attention mask (as in Janus, the pads are attended to).
"""

from __future__ import annotations

import torch

from csd.toy.domain import BACKGROUNDS, COLOURS, COUNT_WORDS, RELATIONS, SHAPES

SPECIAL = ("<pad>", "<bos>", "<boi>")
WORDS = tuple(sorted(
    set(COUNT_WORDS.values()) | set(COLOURS) | set(SHAPES) | {s + "s" for s in SHAPES}
    | {w for r in RELATIONS for w in r.split()} | {"and", "on", "background"} | set(BACKGROUNDS)
))
TEXT_VOCAB = SPECIAL + WORDS
N_TEXT = len(TEXT_VOCAB)
PAD_ID, BOS_ID, BOI_ID = 0, 1, 2
#: longest caption of the grammar ("two red circles left of a blue square on a checkered background")
CAPTION_LEN = 12
PROMPT_LEN = CAPTION_LEN + 2
_WORD_ID = {w: i for i, w in enumerate(TEXT_VOCAB)}


#: what the toy reads, for messages refusing other captions
READS = (f"only the {len(WORDS)} words of its scene captions (csd.toy.vocab.WORDS), at most {CAPTION_LEN} a "
         "caption; use dataset=toy (its held-out scene captions)")
#: unknown words a message names (then "...")
NAMED_WORDS = 4


def caption_problem(caption: str) -> str | None:
    """Why the toy cannot read ``caption`` (words outside :data:`WORDS`, or more than :data:`CAPTION_LEN` of them),
    None if it can: e.g. ``"has 3 unknown words ('apple', 'wooden', 'table')"``."""
    words = caption.split()
    unknown = list(dict.fromkeys(w for w in words if w not in _WORD_ID))
    if unknown:
        named = ", ".join(map(repr, unknown[:NAMED_WORDS])) + (", ..." if len(unknown) > NAMED_WORDS else "")
        return f"has {len(unknown)} unknown word{'s' if len(unknown) > 1 else ''} ({named})"
    if len(words) > CAPTION_LEN:
        return f"has {len(words)} words, more than {CAPTION_LEN}"
    return None


def encode_caption(caption: str | None) -> torch.Tensor:
    """Prompt ids ``[PROMPT_LEN]`` ending with ``<boi>``; ``None`` or ``""`` gives the null caption."""
    words = caption.split() if caption else []
    problem = caption_problem(caption) if caption else None
    if problem is not None:
        raise ValueError(f"the toy model reads {READS}; caption {caption!r} {problem}")
    ids = [PAD_ID] * (CAPTION_LEN - len(words)) + [_WORD_ID[w] for w in words]
    return torch.tensor([BOS_ID, *ids, BOI_ID], dtype=torch.long)
