"""Every config group composes against the schema and instantiates; mistakes fail at compose."""

from __future__ import annotations

import pytest
import torch
from hydra.errors import ConfigCompositionException

import probe
from probe.config import CONFIG_DIR
from probe.data.images import image_folder
from probe.errors import ConfigError
from probe.families.build import build_dataset, build_model

MODELS = sorted(p.stem for p in (CONFIG_DIR / "model").glob("*.yaml"))
DATASETS = sorted(p.stem for p in (CONFIG_DIR / "dataset").glob("*.yaml"))


def test_the_groups_that_the_design_promises_exist():
    assert {"vgg16", "resnet18", "resnet50", "vit_b_16", "torchvision", "custom",
            "transformers"} <= set(MODELS)
    assert {"synthetic", "imagefolder", "cifar10", "text", "tokens",
            "audio"} <= set(DATASETS)


@pytest.mark.parametrize("name", MODELS)
def test_every_model_config_instantiates(make_cfg, request, name):
    extra = {"torchvision": ["model.name=alexnet"],
             "custom": ["model._target_=tests.tiny.TinyNet"],
             "timm": ["model.name=resnet18"]}.get(name, [])
    if name == "transformers":
        extra = [f"model.name={request.getfixturevalue('tiny_lm')}"]
    if name == "open_clip":
        pytest.importorskip("open_clip")
        extra = ["model.name=ViT-S-32"]
    model = build_model(make_cfg(f"model={name}", *extra))
    assert isinstance(model, torch.nn.Module) and not model.training


def _image_tree(root):
    from PIL import Image

    for label in ("cat", "dog"):
        (root / label).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (40, 48), (40 * i, 90, 200)).save(root / label / f"{i}.png")
    return root


def _cifar_tree(root):
    import pickle

    import numpy as np

    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batch = {"data": np.zeros((3, 3072), np.uint8), "labels": [0, 1, 2]}
    (folder / "test_batch").write_bytes(pickle.dumps(batch))
    meta = {"label_names": [str(i) for i in range(10)]}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta))
    return root


@pytest.mark.parametrize("name", DATASETS)
def test_every_dataset_config_instantiates(make_cfg, tmp_path, monkeypatch, request, name):
    extra = ["dataset.image_size=32"] if name == "synthetic" else []
    if name == "imagefolder":
        extra = [f"dataset.root={_image_tree(tmp_path / 'images')}", "dataset.image_size=32"]
    elif name == "cifar10":
        # torchvision checks the archive's md5 sums; the test tree is tiny and made here
        from torchvision.datasets import CIFAR10, cifar

        monkeypatch.setattr(CIFAR10, "_check_integrity", lambda self: True)
        monkeypatch.setattr(cifar, "check_integrity", lambda *args: True)
        extra = [f"dataset.root={_cifar_tree(tmp_path / 'cifar')}"]
    elif name == "text":
        from tests.tiny_text import documents, write_jsonl

        docs = write_jsonl(tmp_path / "docs.jsonl", documents(3))
        extra = [f"dataset.path={docs}", f"dataset.tokenizer={request.getfixturevalue('tiny_lm')}"]
    elif name == "chat":  # a chat template given as a file: the tiny tokenizer has none
        chats = tmp_path / "chats.jsonl"
        chats.write_text('{"messages": [{"role": "user", "content": "the cat"}, '
                         '{"role": "assistant", "content": "a dog"}]}\n')
        template = tmp_path / "chat.jinja"
        template.write_text("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}"
                            "{% endfor %}")
        extra = [f"dataset.path={chats}", f"dataset.chat_template={template}",
                 f"dataset.tokenizer={request.getfixturevalue('tiny_lm')}"]
    elif name == "tokens":
        (tmp_path / "ids.jsonl").write_text('{"input_ids": [3, 1, 4]}\n')
        extra = [f"dataset.path={tmp_path / 'ids.jsonl'}"]
    elif name == "pairs":  # captions through a tiny CLIP's own tokenizer and image processor
        from tests.tiny_vision import tiny_clip, write_pairs

        images = sorted(_image_tree(tmp_path / "images").glob("*/*.png"))
        extra = [f"dataset.path={write_pairs(tmp_path / 'pairs.csv', images)}",
                 "model=transformers", f"model.name={tiny_clip(tmp_path / 'clip')}"]
    elif name == "audio":
        from transformers import Wav2Vec2FeatureExtractor

        from tests.tiny_audio import clip_folder

        Wav2Vec2FeatureExtractor().save_pretrained(tmp_path / "extractor")
        extra = [f"dataset.root={clip_folder(tmp_path / 'clips', [0.2])}",
                 f"dataset.feature_extractor={tmp_path / 'extractor'}"]
    elif name == "video":
        from tests.tiny_video import write_video

        write_video(tmp_path / "videos/a/one.mkv", 25)
        extra = [f"dataset.root={tmp_path / 'videos'}", "dataset.frames=4"]
    cfg = make_cfg(f"dataset={name}", *extra)
    dataset = build_dataset(cfg)  # dataset.on_error is probe's, not the dataset's argument
    if name == "pairs":
        item = dataset[0]
        assert item["pixel_values"].shape == (3, 32, 32) and item["input_ids"].shape == (12,)
        return
    if name == "audio":
        assert dataset[0]["audio"].shape == (3200,) and dataset[0]["target"] == 0
        return
    if name == "video":  # two-second windows ending at 0, 1 and 2 s of a 2.5 s film
        assert len(dataset) == 3 and dataset[0]["video"].shape == (3, 4, 24, 32)
        return
    if name in ("text", "tokens", "chat"):
        item = dataset[0]
        assert item["input_ids"].dtype == torch.int64 and item["keep"].all()
        if name == "chat":  # "assistant: a dog" is the assistant's
            assert item["columns"]["loss_mask"].any() and not item["columns"]["loss_mask"].all()
        return
    image, target = dataset[0]
    assert image.shape[0] == 3 and image.shape[-1] == 32 and isinstance(target, int)


def test_synthetic_items_are_the_same_on_every_run():
    from probe.data.images import SyntheticImages

    a, b = SyntheticImages(4, 32, seed=1), SyntheticImages(4, 32, seed=1)
    assert torch.equal(a[2][0], b[2][0]) and a[2][1] == b[2][1]
    assert not torch.equal(a[2][0], SyntheticImages(4, 32, seed=2)[2][0])


def test_imagefolder_uses_the_imagenet_eval_transform(tmp_path):
    dataset = image_folder(str(_image_tree(tmp_path / "images")), image_size=24)
    image, _ = dataset[0]
    assert image.shape == (3, 24, 24)
    assert abs(float(image[2].mean()) - (200 / 255 - 0.406) / 0.225) < 0.02  # normalised


def test_mistyped_key_and_wrong_type_fail_at_composition(make_cfg):
    with pytest.raises(ConfigCompositionException, match="batchsize"):
        make_cfg("batchsize=4")
    with pytest.raises(ConfigCompositionException, match=r"batch_size=four") as bad:
        make_cfg("batch_size=four")
    assert "could not be converted to Integer" in str(bad.value.__cause__)
    # capture kinds are open (probe.pipeline.kinds.register): the plan refuses an unknown
    # one, in one line that names the known ones, before any file exists
    with pytest.raises(ConfigError, match=r"hook 'forwards' is unknown; use any of forward, "
                                          r"forward_pre, backward"):
        probe.plan(make_cfg("hooks=[forwards]"))
