"""``python -m probe.verify``: one language-model checkpoint through probe four ways, each
against the model computed sample by sample without padding (probe.pipeline.verify.oracle):

    names       the per-run checks of the standard names (probe.families.hf_verify)
    forward     every block's rows (blocks.*) on a padded batch of texts of three lengths
    attention   every attention module's patterns against the eager model's weights
    generation  greedy answers: the rows of the middle block equal a teacher-forced forward
                over prompt + answer, and each new token is that forward's argmax
    gradients   the middle block's gradient of nll (a masked model's: top1) against autograd

    verdicts = verify_model(["model=transformers", "model.name=gpt2"], folder)
    verdicts["forward"].outcome    # pass | wrong | refused | n/a

A check that probe refuses is "refused" with probe's one line; one that does not apply to the
model (a masked model generates nothing) is "n/a"; a row that differs is "wrong".
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from probe.pipeline.verify.checks import CHECKS, Verdict, run_checks

__all__ = ["verify_model", "Verdict", "CHECKS", "TEXTS"]

# three lengths, so that every batch is padded
TEXTS = ("the cat sat on the mat", "a small red bird flew over the big house and then it sat "
         "on a tree", "the dog ran")


def verify_model(overrides: Sequence[str], folder: Path) -> dict[str, Verdict]:
    """Every check's verdict for the model that ``overrides`` (a command line's) name; the
    runs' files go to ``folder``.

    Raises:
        ProbeError: a model that cannot be built, or that does not read text.
    """
    return run_checks(list(overrides), TEXTS, folder)
