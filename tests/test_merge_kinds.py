"""Shards of every kind of file merge into one equal to the single run: images, text, token
ids, audio with transcripts, image-text pairs (strings: file names and captions) and ViT patch
grids. Each dataset of the single run is compared with the merged one, sample by sample, its
attrs too; per-token datasets slice by ``/offsets``."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

import probe
from probe.file.merge import merge
from tests.conftest import TINY_NET
from tests.tiny_text import documents, write_jsonl

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_lm):
    from tests.tiny_audio import clip_folder, tiny_wav2vec2
    from tests.tiny_vision import pictures, tiny_clip, tiny_vit, write_pairs

    root = tmp_path_factory.mktemp("merge-kinds")
    images = pictures(root / "images")
    ids = root / "ids.jsonl"
    ids.write_text("".join(json.dumps({"input_ids": [(7 * n + k) % 50 for k in range(n + 2)]})
                           + "\n" for n in range(7)))
    clips = sorted(clip_folder(root / "clips", [0.1, 0.2, 0.05, 0.15, 0.1]).rglob("*.wav"))
    speech = root / "speech.jsonl"
    speech.write_text("".join(json.dumps({"audio": str(p), "text": "ab" * (n + 1)}) + "\n"
                              for n, p in enumerate(clips)))
    return {"lm": tiny_lm, "docs": write_jsonl(root / "docs.jsonl", documents(7, high=20)),
            "ids": ids, "speech": speech, "wav2vec2": tiny_wav2vec2(root / "wav2vec2"),
            "clip": tiny_clip(root / "clip"), "vit": tiny_vit(root / "vit"),
            "pairs": write_pairs(root / "pairs.csv", images), "images": root / "images"}


KINDS = {
    "images": lambda d: [*TINY_NET, "layers=[features.3,fc]", "hooks=[forward,backward]"],
    "text": lambda d: ["model=transformers", f"model.name={d['lm']}", "dataset=text",
                       f"dataset.path={d['docs']}", "layers=[transformer.h.0]"],
    "tokens": lambda d: ["model=transformers", f"model.name={d['lm']}", "dataset=tokens",
                         f"dataset.path={d['ids']}", "layers=[transformer.h.1]"],
    "audio": lambda d: ["model=transformers", f"model.name={d['wav2vec2']}", "model.head=base",
                        "dataset=audio", f"dataset.path={d['speech']}",
                        "dataset.transcript_column=text", "layers=[encoder.layers.0]"],
    "pairs": lambda d: ["model=transformers", f"model.name={d['clip']}", "dataset=pairs",
                        f"dataset.path={d['pairs']}",
                        "layers=[vision_model.encoder.layers.0,text_model.encoder.layers.1]"],
    "patches": lambda d: ["model=transformers", f"model.name={d['vit']}",
                          "dataset=imagefolder", f"dataset.root={d['images']}",
                          "dataset.image_size=32", "layers=[vit.layers.0]",
                          "tokens=patches"],
}


# virtual datasets for every kind; a --copy merge holds the values itself (strings are copied
# either way: HDF5 cannot map them)
@pytest.mark.parametrize(("kind", "copy"), [*((kind, False) for kind in sorted(KINDS)),
                                            ("pairs", True)])
def test_every_kind_of_file_merges_into_the_single_run(make_cfg, inputs, tmp_path, kind, copy):
    # batch_size=1: each sample is computed alone in every run, so values match bit for bit
    overrides = [*KINDS[kind](inputs), "batch_size=1"]
    single = probe.run(make_cfg(*overrides, output=tmp_path / "single.h5"))
    shards = [probe.run(make_cfg(*overrides, "shard.count=2", f"shard.index={k}",
                                 output=tmp_path / f"s{k}" / "features.h5")) for k in range(2)]
    merged = merge(tmp_path / "merged.h5", shards, copy=copy)
    _assert_same_samples(merged, single)


def _assert_same_samples(merged, single) -> None:
    """Every dataset of ``single`` is in ``merged`` with the same attrs and, sample by sample,
    the same values (the merged rows may be in another order: /index says whose they are)."""
    with h5py.File(merged, "r") as many, h5py.File(single, "r") as one:
        names = _datasets(one)
        assert sorted(names) == sorted(_datasets(many))
        where = {int(sample): row for row, sample in enumerate(many["index"][:])}
        order = [where[int(sample)] for sample in one["index"][:]]
        samples = len(order)
        for name in names:
            a, b = _values(one[name]), _values(many[name])
            for key, value in one[name].attrs.items():
                assert np.array_equal(value, many[name].attrs[key]), (name, key)
            if name == "offsets":
                np.testing.assert_array_equal(np.diff(a), np.diff(b)[order], err_msg=name)
            elif "offsets" in one and len(a) == one["offsets"][-1] and len(a) != samples:
                bounds_a, bounds_b = one["offsets"][:], many["offsets"][:]
                for i, row in enumerate(order):
                    np.testing.assert_array_equal(a[bounds_a[i]:bounds_a[i + 1]],
                                                  b[bounds_b[row]:bounds_b[row + 1]],
                                                  err_msg=f"{name}, sample {i}")
            else:
                assert len(a) == samples, name
                np.testing.assert_array_equal(a, b[order], err_msg=name)


def _datasets(f: h5py.File) -> list[str]:
    names = []
    f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    return names


def _values(dataset: h5py.Dataset) -> np.ndarray:
    if h5py.check_string_dtype(dataset.dtype) is not None:
        return np.asarray(dataset.asstr()[:], dtype=object)
    return dataset[:]
