"""Each check of probe.verify: a run of probe on the texts, its rows read back sample by sample
and compared with the model computed alone (probe.pipeline.verify.oracle)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
from torch import nn

from probe.config.compose import compose
from probe.data.feed import DataKind
from probe.data.text.corpus import TextDataset
from probe.errors import ConfigError, ProbeError
from probe.families.build import build_model
from probe.families.names import StandardNames
from probe.families.registry import family_for
from probe.file.format import DECODER_INPUT_IDS, Attr, bounds_of
from probe.pipeline.execute import execute
from probe.pipeline.plan import plan
from probe.pipeline.verify.oracle import gradient_alone, outputs_alone, patterns_alone

__all__ = ["CHECKS", "Verdict", "run_checks"]

CHECKS = ("names", "forward", "attention", "generation", "gradients")
_NEW = 4  # tokens a generation check answers with
_RTOL = 1e-4  # of the largest value the model computed: float32 sums in another order


@dataclass(frozen=True)
class Verdict:
    """What one check found: ``outcome`` pass, wrong, refused or n/a, and ``detail``."""

    outcome: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.outcome}: {self.detail}" if self.detail else self.outcome


class _Wrong(Exception):
    """A row that differs from the model's own."""


@dataclass
class _Session:
    overrides: list[str]
    model: nn.Module
    names: StandardNames
    folder: Path
    stack: str  # "encoder." for an encoder-decoder (its encoder is what text runs), else ""
    targets: list[list[int]]  # an encoder-decoder's: each text's target, as token ids

    def run(self, name: str, *extra: str) -> Path:
        cfg = compose([*self.overrides, *extra, f"output.path={self.folder / name}.h5",
                       "output.overwrite=true"])
        return execute(plan(cfg, model=self.model))


def run_checks(overrides: list[str], texts: Sequence[str], folder: Path) -> dict[str, Verdict]:
    """Every check's verdict (see probe.pipeline.verify)."""
    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "texts.jsonl"
    # an encoder-decoder's target (its decoder's rows, teacher-forced): the text's words
    # backwards
    targets = [" ".join(text.split()[::-1]) for text in texts]
    corpus.write_text("".join(json.dumps({"text": text, "target": target}) + "\n"
                              for text, target in zip(texts, targets, strict=True)))
    overrides = [*overrides, "dataset=text", f"dataset.path={corpus}", "batch_size=3",
                 "hooks=[forward]", "tokens=all", "reduce=none", "output.dtype=float32"]
    base = compose(overrides)
    model = build_model(base)
    family = family_for(base.model, model)
    if DataKind.text not in family.reads:
        raise ConfigError(f"probe.verify checks language models for now; "
                          f"{type(model).__name__} reads {family.reads[0].value}")
    names = family.names(model)
    if names is None or names.refused is not None:
        why = "its family has no standard names" if names is None else names.refused
        return dict.fromkeys(CHECKS, Verdict("refused", why))
    stack = "encoder." if "encoder" in names.stacks else ""
    if stack:  # as the run tokenizes them (dataset.target_column)
        tokenizer = TextDataset(path=str(corpus), tokenizer=str(base.dataset.tokenizer)).tokenizer
        targets = [tokenizer(text_target=target)["input_ids"] for target in targets]
    session = _Session(overrides, model, names, folder, stack, targets)
    verdicts = {}
    for check in (_forward, _attention, _generation, _gradients):
        try:
            verdicts.update(check(session))
        except _Wrong as wrong:
            verdicts[check.__name__.strip("_")] = Verdict("wrong", str(wrong))
        except ProbeError as err:
            refused = Verdict("wrong" if str(err).startswith("verify:") else "refused",
                              str(err))
            verdicts[check.__name__.strip("_")] = refused
            if check is _forward:
                verdicts["names"] = refused
    return {check: verdicts.get(check, Verdict("n/a")) for check in CHECKS}


def _samples(path: Path, *keys: str) -> list[dict[str, np.ndarray]]:
    # each sample's rows of every key (and of its token ids), by the bounds of each
    with h5py.File(path) as f:
        columns = {key: (f[key][:], f[bounds_of(f[key].attrs)][:])
                   for key in ("input_ids", DECODER_INPUT_IDS, *keys) if key in f}
    return [{key: value[bounds[n]:bounds[n + 1]] for key, (value, bounds) in columns.items()}
            for n in range(len(columns["input_ids"][1]) - 1)]


def _compare(what: str, ours: np.ndarray, theirs: np.ndarray) -> float:
    """The largest difference, relative to the largest value the model gave.

    Raises:
        _Wrong: a shape or a value that differs.
    """
    if ours.shape != theirs.shape:
        raise _Wrong(f"{what} is {ours.shape}, the model's {theirs.shape}")
    scale = max(float(np.abs(theirs).max(initial=0)), 1e-12)
    difference = float(np.abs(ours - theirs).max(initial=0)) / scale
    if difference > _RTOL:
        raise _Wrong(f"{what} differs from the model's by {difference:.2g} of its largest "
                     "value")
    return difference


def _forward(session: _Session) -> dict[str, Verdict]:
    blocks = dict(session.names.expand(f"{session.stack}blocks.*"))
    path = session.run("forward", f"layers=[{session.stack}blocks.*]")
    with h5py.File(path) as f:
        said = json.loads(f.attrs[Attr.VERIFIED])
    worst = 0.0
    for n, sample in enumerate(_samples(path, *(f"{name}/output" for name in blocks))):
        alone, _ = outputs_alone(session.model, sample["input_ids"], list(blocks.values()))
        for name, module in blocks.items():
            worst = max(worst, _compare(f"{name}'s rows of text {n}", sample[f"{name}/output"],
                                        alone[module]))
    return {"names": Verdict("pass", "; ".join(v.removeprefix("pass: ") for v in said.values())),
            "forward": Verdict("pass", f"{len(blocks)} blocks, within {worst:.1g}")}


def _attention(session: _Session) -> dict[str, Verdict]:
    try:  # the blocks that have attention
        modules = dict(session.names.expand(f"{session.stack}blocks.*.attention"))
    except ConfigError:  # none has (a state-space model)
        return {"attention": Verdict("n/a", "its blocks compute no attention")}
    path = session.run("attention", f"layers=[{session.stack}blocks.*.attention]",
                       "hooks=[attention]")
    worst = 0.0
    for n, sample in enumerate(_samples(path, *(f"{name}/attention" for name in modules))):
        alone = patterns_alone(session.model, sample["input_ids"], encoder=bool(session.stack))
        if len(alone) != len(modules):
            raise _Wrong(f"the eager model gives {len(alone)} patterns for {len(modules)} "
                         "attention modules")
        length = len(sample["input_ids"])
        for name, weights in zip(modules, alone, strict=True):
            rows = sample[f"{name}/attention"]  # (queries, heads, padded keys)
            if rows[:, :, length:].any():
                raise _Wrong(f"{name}'s rows of text {n} have weight beyond its last key")
            worst = max(worst, _compare(f"{name}'s pattern of text {n}",
                                        rows[:, :, :length].transpose(1, 0, 2), weights))
    return {"attention": Verdict("pass", f"{len(modules)} modules, within {worst:.1g}")}


def _generation(session: _Session) -> dict[str, Verdict]:
    model = session.model
    if not (hasattr(model, "can_generate") and model.can_generate()):
        return {"generation": Verdict("n/a", "the model has no language-model head")}
    middle = f"{session.stack.replace('encoder.', 'decoder.')}blocks.50%"
    path = session.run("generation", f"layers=[{middle}]", f"generate.max_new_tokens={_NEW}")
    with h5py.File(path) as f:
        module = json.loads(f.attrs[Attr.MODULES])[middle]
        if session.stack:
            return _decoded_generation(session, path, middle, module)
        generated = f["generated"][:]
        bounds = f["offsets"][:]
    worst = 0.0
    for n, sample in enumerate(_samples(path, f"{middle}/output")):
        ids = sample["input_ids"]
        alone, logits = outputs_alone(model, ids, [module])
        worst = max(worst, _compare(f"{middle}'s rows of answer {n}", sample[f"{middle}/output"],
                                    alone[module]))
        new = generated[bounds[n]:bounds[n + 1]]
        prompt = int((~new).sum())
        greedy = logits[prompt - 1:-1].argmax(-1)
        if not (greedy == ids[prompt:]).all():
            raise _Wrong(f"answer {n} is {ids[prompt:].tolist()}, the teacher-forced argmax "
                         f"{greedy.tolist()}")
    return {"generation": Verdict("pass", f"{_NEW} greedy tokens a prompt, rows within "
                                          f"{worst:.1g}")}


def _decoded_generation(session: _Session, path: Path, middle: str, module: str
                        ) -> dict[str, Verdict]:
    """An encoder-decoder's answers: its decoder's rows of each step against the model run on
    the prompt with the tokens the steps read, and each token read the argmax of the step
    before."""
    worst = 0.0
    for n, sample in enumerate(_samples(path, f"{middle}/output")):
        read = sample[DECODER_INPUT_IDS]
        alone, logits = outputs_alone(session.model, sample["input_ids"], [module], read)
        worst = max(worst, _compare(f"{middle}'s rows of answer {n}", sample[f"{middle}/output"],
                                    alone[module]))
        greedy = logits[:-1].argmax(-1)
        if not (greedy == read[1:]).all():
            raise _Wrong(f"answer {n} is {read[1:].tolist()}, the teacher-forced argmax "
                         f"{greedy.tolist()}")
    return {"generation": Verdict("pass", f"{_NEW} greedy tokens a prompt, the decoder's rows "
                                          f"within {worst:.1g}")}


def _gradients(session: _Session) -> dict[str, Verdict]:
    model = session.model
    objective = "nll" if hasattr(model, "can_generate") and model.can_generate() else "top1"
    # an encoder-decoder's nll is its target's, through its decoder
    middle = f"{session.stack.replace('encoder.', 'decoder.')}blocks.50%"
    target = ["dataset.target_column=target"] if session.stack else []
    path = session.run("gradients", f"layers=[{middle}]", "hooks=[backward]",
                       f"objective={objective}", *target)
    with h5py.File(path) as f:
        module = json.loads(f.attrs[Attr.MODULES])[middle]
    worst = 0.0
    for n, sample in enumerate(_samples(path, f"{middle}/grad_output")):
        alone = gradient_alone(model, sample["input_ids"], module, objective,
                               session.targets[n] if session.stack else None)
        worst = max(worst, _compare(f"{middle}'s gradient of text {n}",
                                    sample[f"{middle}/grad_output"], alone))
    return {"gradients": Verdict("pass", f"d {objective} / d {middle}, within {worst:.1g}")}
