"""int8 label scoring (``scoring.int8``, issue 77): the scoring LM's lean forward with its q/k/v and gate/up
projections in int8 after SmoothQuant, everything else (attention, the norms, o and down, the LM head, the
log-softmax) in the loaded dtype.

Why these projections and this rule (``benchmarks.int8_labels``, two Zen 4 cores, 768 MTOP label pairs): they are
the variant that kept the labels (as computed here: Spearman 0.983 per query against bf16, 95% of the positives the
same) at 1.24x bf16's rate; int8 everywhere ran ~1.3x but lost them (0.84-0.92). It is therefore an option and never
``auto``'s choice: bf16 labels agree with fp32 at 0.997, and 1.24x does not bring the recipe near issue 77's bar
(``benchmarks.int8_floor``).

The SmoothQuant scales are calibrated on a fixed text packaged here (:data:`CALIBRATION`), never on a run's data:
scores are cached by text under :func:`key`, so a scale that depended on the data would let one run's cache serve
another's different computation. The key names the calibration text's digest, alpha and the projections.

Runs only on a CPU whose int8 product is native and exact (:func:`epr.lm.int8_linear.fused_supported`) and with the
lean forward; elsewhere :func:`unavailable` says why and the scorer keeps its dtype (and its key: the key names
what computed, so a fallback never writes int8's name on bf16 scores).
"""

from __future__ import annotations

import hashlib
import logging

import torch

__all__ = ["ALPHA", "CALIBRATION", "PROJECTIONS", "key", "quantized_backbone", "unavailable"]

log = logging.getLogger(__name__)

ALPHA = 0.5
# the FastLlama projections made int8: q/k/v (1) and gate/up (4) (epr.lm.smooth_quant's numbering)
PROJECTIONS = (1, 4)

# what the scales are calibrated on: prompts shaped like the labels' (demonstrations, then the input and output),
# over the kinds of text the shipped tasks carry (questions, decompositions, logical forms, dialogue programs)
CALIBRATION = (
    "what is the weather like in paris tomorrow morning\t[IN:GET_WEATHER [SL:LOCATION paris ] "
    "[SL:DATE_TIME tomorrow morning ] ]\nremind me to call mom at 5 pm\t[IN:CREATE_REMINDER [SL:PERSON_REMINDED me ] "
    "[SL:TODO call mom ] [SL:DATE_TIME at 5 pm ] ]\nplay some jazz music\t[IN:PLAY_MUSIC [SL:MUSIC_GENRE jazz ] ]\n",
    "How many cylinders are left of the big red sphere?\treturn big red sphere ;return cylinders left of #1 ;"
    "return number of #2\nWhat year did the team that won the 1998 cup first play?\treturn team that won the 1998 "
    "cup ;return year #1 first played\nWho directed the film with the highest rating?\treturn films ;return ratings "
    "of #1 ;return #1 where #2 is highest ;return director of #3\n",
    "Schedule a meeting with Alice next Tuesday at 3\t(Yield (CreateCommitEventWrapper (CreatePreflightEventWrapper "
    "(Event.start_? (DateTime.date_? (?= (NextDOW (Tuesday)))))))\nWho is my manager?\t(Yield (FindManager (toRecipient "
    "(CurrentUser))))\nWhat is on my calendar today?\t(Yield (FindEventWrapperWithDefaults (EventOnDate (Today))))\n",
    "Q: What happens if you eat watermelon seeds?\nA: The watermelon seeds pass through your digestive system.\n"
    "Q: Where were fortune cookies invented?\nA: The precise origin of fortune cookies is unclear.\n"
    "Q: Why do veins appear blue?\nA: Veins appear blue because blue light does not penetrate deeply into tissue.\n",
    "The committee met on 14 March 2019 and approved the budget of $2.4 million, 37% more than the year before. "
    "def score(pairs):\n    return [len(a) + len(b) for a, b in pairs]\n# 1, 2, 3, 5, 8, 13, 21, 34, 55, 89\n",
)


def key() -> dict:
    """What names int8 scores besides the LM's key: the rule, its alpha, the projections and the calibration."""
    digest = hashlib.sha256("\x00".join(CALIBRATION).encode()).hexdigest()[:16]
    return {
        "int8": {
            "rule": "smoothquant-fused",
            "alpha": ALPHA,
            "projections": list(PROJECTIONS),
            "calibration": digest,
        }
    }


def unavailable(device: str, forward: str) -> str | None:
    """``None`` where int8 scoring runs here; else why not (for the caller's message)."""
    if not str(device).startswith("cpu"):
        return f"int8 scoring runs on a CPU (oneDNN), not on {device}"
    if forward != "fast":
        return "int8 scoring needs the lean forward (scoring.forward: fast)"
    from epr.lm.int8_linear import fused_supported

    return fused_supported()


def quantized_backbone(model, tok):
    """A FastLlama of ``model`` of its own (the model's shared one, used by its decoder, is left as it is) with
    :data:`PROJECTIONS` smoothed and int8; ``None`` where the lean forward does not reproduce the model."""
    from epr.lm.fastlm import FastLlama, fast_backbone
    from epr.lm.int8_linear import FusedInt8Linear
    from epr.lm.smooth_quant import calibrate, smoothed

    if fast_backbone(model) is None:
        return None
    fast = FastLlama(model)
    device = next(model.parameters()).device
    seqs = [tok(t, add_special_tokens=False)["input_ids"] for t in CALIBRATION]

    def run():
        with torch.inference_mode():
            for ids in seqs:
                fast(torch.tensor([ids], device=device))

    stats = calibrate(fast.layers, run)
    fast.layers[:] = smoothed(fast.layers, stats, FusedInt8Linear, PROJECTIONS, ALPHA)
    return fast
