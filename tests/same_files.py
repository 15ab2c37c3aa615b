"""The files of six runs as 0.2.0 wrote them, kept as goldens in tests/golden/ (every dataset's
values, type and shape, every attr), so that a change of the code that writes them is seen
byte for byte: an image run with gradients, a text run with every hook and gradients, a
generation, a vision-language model generating, attention patterns of text and of a ViT.

    python -m tests.same_files tests/golden      # write the goldens with the code checked out

Only what a run cannot reproduce is left out of the comparison: the time, the versions, the
temporary folder the inputs were made in (replaced by ``<tmp>``), and the digest of the code
of test models (whose files may change without changing what they compute).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np

# root attrs that say when and with what a file was written, not what it holds
_VARYING = {"created", "probe_version", "torch_version"}
NEW_TOKENS = 3


def _image(tmp: Path) -> list[str]:
    return ["model=custom", "model._target_=tests.tiny.TinyNet", "dataset.image_size=8",
            "dataset.num_samples=6", "batch_size=4", "layers=[features.*,fc]",
            "hooks=[forward,backward,forward_pre]", "reduce_by_layer={features.3:mean}",
            "output.dtype=float16"]


def _text(tmp: Path) -> list[str]:
    lm, corpus = _language_model(tmp)
    return ["model=transformers", f"model.name={lm}", "dataset=text", f"dataset.path={corpus}",
            "batch_size=3", "layers=[transformer.h.0,transformer.h.1.mlp]",
            "hooks=[forward,forward_pre,backward,backward_input]", "objective=nll"]


def _generation(tmp: Path) -> list[str]:
    lm, corpus = _language_model(tmp)
    return ["model=transformers", f"model.name={lm}", "dataset=text", f"dataset.path={corpus}",
            "batch_size=3", "layers=[transformer.h.0,transformer.h.1]",
            f"generate.max_new_tokens={NEW_TOKENS}"]


def _attention(tmp: Path) -> list[str]:
    lm, corpus = _language_model(tmp)
    return ["model=transformers", f"model.name={lm}", "dataset=text", f"dataset.path={corpus}",
            "dataset.max_length=24", "batch_size=3",
            "layers=[transformer.h.0.attn,transformer.h.1.attn]", "hooks=[attention,forward]"]


def _vit_attention(tmp: Path) -> list[str]:
    from tests.tiny_vision import pictures, tiny_vit

    folder, images = tmp / "vit", tmp / "images"
    if not folder.exists():
        tiny_vit(folder)
        pictures(images)
    return ["model=transformers", f"model.name={folder}", "dataset=imagefolder",
            f"dataset.root={images}", "batch_size=4",
            "layers=[vit.layers.*.attention]",
            "hooks=[attention,forward]", "tokens=first"]


def _vision_language(tmp: Path) -> list[str]:
    from tests.tiny_vlm import tiny_vlm

    folder, pairs = tmp / "llava", tmp / "pairs" / "pairs.jsonl"
    if not folder.exists():
        from PIL import Image

        tiny_vlm("llava", folder)
        pairs.parent.mkdir()
        rng = np.random.default_rng(0)
        rows = []
        for n, prompt in enumerate(["the cat sat", "a big red dog ran", "it was", "then"]):
            pixels = (rng.random((32 + 8 * (n % 2), 40, 3)) * 255).astype("uint8")
            Image.fromarray(pixels).save(pairs.parent / f"{n}.png")
            rows.append({"image": f"{n}.png", "text": prompt})
        pairs.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return ["model=transformers", f"model.name={folder}", "dataset=pairs",
            f"dataset.path={pairs}", "batch_size=3",
            "layers=[model.language_model.layers.1,model.vision_tower.encoder.layers.1,"
            "model.multi_modal_projector]", f"generate.max_new_tokens={NEW_TOKENS}"]


def _language_model(tmp: Path) -> tuple[Path, Path]:
    from tests.tiny_text import documents, tiny_gpt2, write_jsonl

    folder, corpus = tmp / "gpt2", tmp / "docs.jsonl"
    if not folder.exists():
        tiny_gpt2(folder)
        write_jsonl(corpus, documents(5, seed=3, low=2, high=10))
    return folder, corpus


CASES: dict[str, Callable[[Path], list[str]]] = {
    "image": _image, "text": _text, "generation": _generation, "attention": _attention,
    "vit_attention": _vit_attention, "vision_language": _vision_language}


def run_case(name: str, tmp: Path) -> Path:
    """Run case ``name`` with inputs made in ``tmp``, on one thread (a sum over several
    threads adds in another order); the path of its file."""
    import torch

    import probe
    from tests.conftest import compose_cfg

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return probe.run(compose_cfg(*CASES[name](tmp), output=tmp / f"{name}.h5"))
    finally:
        torch.set_num_threads(threads)


def snapshot(path: Path, tmp: Path) -> tuple[dict[str, np.ndarray], dict]:
    """A file as arrays (every numeric dataset, by name) and a JSON-able description (every
    dataset's type, shape and attrs, its strings, the root attrs), with ``tmp`` as <tmp>."""
    arrays, meta = {}, {"datasets": {}}
    with h5py.File(path) as f:
        meta["root"] = _attrs(f.attrs, tmp)
        names = []
        f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset)
                     else None)
        for name in names:
            dataset = f[name]
            said = {"dtype": str(dataset.dtype), "shape": list(dataset.shape),
                    "attrs": _attrs(dataset.attrs, tmp)}
            if dataset.dtype.kind == "O":
                said["strings"] = [s.decode() if isinstance(s, bytes) else s
                                   for s in dataset[()]]
            else:
                arrays[name] = dataset[()]
            meta["datasets"][name] = said
    return arrays, meta


def _attrs(attrs, tmp: Path) -> dict:
    said = {}
    for key, value in attrs.items():
        if key in _VARYING or key.endswith("_version"):
            continue
        value = _plain(value)
        if key == "model_fingerprint":  # test models' code may change; what they compute not
            value = json.dumps({k: v for k, v in json.loads(value).items() if k != "code"},
                               sort_keys=True)
        said[key] = _no_tmp(value, tmp)
    return said


def _plain(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _no_tmp(value, tmp: Path):
    if isinstance(value, str):
        return value.replace(str(tmp), "<tmp>")
    if isinstance(value, list):
        return [_no_tmp(v, tmp) for v in value]
    return value


def write_goldens(folder: Path) -> None:
    import tempfile

    import torch

    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in CASES:
            arrays, meta = snapshot(run_case(name, Path(tmp)), Path(tmp))
            meta["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
            np.savez_compressed(folder / f"{name}.npz", **{k.replace("/", "|"): v
                                                         for k, v in arrays.items()})
            (folder / f"{name}.json").write_text(json.dumps(meta, indent=1, sort_keys=True))


if __name__ == "__main__":
    write_goldens(Path(sys.argv[1]))
