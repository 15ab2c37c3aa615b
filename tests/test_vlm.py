"""Vision-language models (LLaVA, Qwen2-VL, Idefics3, PaliGemma, Gemma 3): images with prompts
through the checkpoint's own processor. Every stored row equals the model run on that sample
alone through its processor, for layers of the language model (a row per position, image
placeholders included, with /modality and /patch), of the vision tower and of the projector
(a row per image), with and without generation (teacher-forced over prompt + answer). Tiny
models with random weights, built here; no downloads."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

from probe.errors import ConfigError, DataError
from tests.cli import cli
from tests.conftest import compose_cfg, no_h5_files, run_with
from tests.tiny_vlm import tiny_vlm

pytest.importorskip("transformers")

PROMPTS = ["the cat sat", "a big red dog ran under the tree", "it was", "the bird flew over",
           "small blue house", "then it ran"]
NEW = 3
# each family's language-model, vision-tower and projector layers (None: its vision tower
# has no row per image)
PARTS = {
    "llava": ("model.language_model.layers.1", "model.vision_tower.encoder.layers.1",
              "model.multi_modal_projector"),
    "qwen2_vl": ("model.language_model.layers.1", None, None),
    "idefics3": ("model.text_model.layers.1", "model.vision_model.encoder.layers.1",
                 "model.connector"),
    "paligemma": ("model.language_model.layers.1", "model.vision_tower.encoder.layers.1",
                  "model.multi_modal_projector"),
    "gemma3": ("model.language_model.layers.1", "model.vision_tower.encoder.layers.1",
               "model.multi_modal_projector"),
}
# the side of each image's square grid of tokens in the language model's sequence
SIDES = {"llava": 4, "idefics3": 2, "paligemma": 4, "gemma3": 4}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Six images of two sizes and their prompts, in a jsonl file."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("pairs")
    rng = np.random.default_rng(0)
    rows = []
    for n, prompt in enumerate(PROMPTS):
        pixels = (rng.random((32 + 8 * (n % 2), 40, 3)) * 255).astype("uint8")
        Image.fromarray(pixels).save(folder / f"{n}.png")
        rows.append({"image": f"{n}.png", "text": prompt})
    path = folder / "pairs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    made = {}

    def folder(family: str):
        if family not in made:
            made[family] = tiny_vlm(family, tmp_path_factory.mktemp(family))
        return made[family]

    return folder


def vlm_cfg(folder, pairs, output, *overrides):
    return compose_cfg("model=transformers", f"model.name={folder}", "dataset=pairs",
                       f"dataset.path={pairs}", "batch_size=4", *overrides, output=output)


def oracle(folder, pairs, layers, answers=None):
    """Each sample alone through the processor and the model (hooks of its own), as
    {layer: (rows...)}; ``answers``: each sample's generated ids, fed after its prompt."""
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    config = model.config
    modules = dict(model.named_modules())
    samples = [json.loads(line) for line in pairs.read_text().splitlines()]
    found = []
    for n, sample in enumerate(samples):
        image = Image.open(pairs.parent / sample["image"]).convert("RGB")
        prompt = sample["text"]
        if processor.chat_template is not None:
            turn = [{"type": "image"}, {"type": "text", "text": prompt}]
            prompt = processor.apply_chat_template([{"role": "user", "content": turn}],
                                                   add_generation_prompt=True, tokenize=False)
        inputs = dict(processor(images=[[image]], text=[prompt], return_tensors="pt"))
        inputs.pop("labels", None)
        if answers is not None:  # teacher-forced: the prompt, then the answer's tokens
            extra = torch.tensor(answers[n]).view(1, -1)
            length = inputs["input_ids"].shape[1]
            # an answer is text (token type 0), and to PaliGemma a suffix (type 1: causal,
            # where the prefix attends both ways)
            ones = ("attention_mask", *(("token_type_ids",) if config.model_type == "paligemma"
                                        else ()))
            for key, value in list(inputs.items()):
                if value.dim() == 2 and value.shape[1] == length:
                    fill = extra if key == "input_ids" else (
                        torch.ones_like(extra) if key in ones else torch.zeros_like(extra))
                    inputs[key] = torch.cat([value, fill], 1)
        seen = {}
        handles = [modules[layer].register_forward_hook(
            lambda m, a, out, layer=layer, seen=seen: seen.setdefault(
                layer, (out[0] if isinstance(out, tuple) else out).detach()))
            for layer in layers]
        with torch.no_grad():
            model(**inputs)
        for handle in handles:
            handle.remove()
        found.append({"input_ids": inputs["input_ids"][0], **seen})
    return found, config


def _rows(path):
    with h5py.File(path) as f:
        return {key: f[key][()] for key in f if isinstance(f[key], h5py.Dataset)} | {
            key: f[key]["output"][()] for key in f if isinstance(f[key], h5py.Group)}


@pytest.mark.parametrize("family", list(PARTS))
def test_rows_equal_each_sample_alone(family, checkpoints, pairs, tmp_path):
    folder = checkpoints(family)
    layers = [layer for layer in PARTS[family] if layer is not None]
    path = run_with(vlm_cfg(folder, pairs, tmp_path / "f.h5", f"layers=[{','.join(layers)}]"))
    stored = _rows(path)
    alone, config = oracle(folder, pairs, layers)
    image_token = getattr(config, "image_token_id", None)
    if image_token is None:
        image_token = config.image_token_index
    language, *vision = layers
    bounds = stored["offsets"]
    for n, sample in enumerate(alone):
        rows = slice(bounds[n], bounds[n + 1])
        np.testing.assert_array_equal(stored["input_ids"][rows], sample["input_ids"].numpy())
        np.testing.assert_allclose(stored[language][rows], sample[language][0].numpy(),
                                   atol=1e-4, rtol=1e-4)
        image = sample["input_ids"].numpy() == image_token
        np.testing.assert_array_equal(stored["modality"][rows], image.astype(np.uint8))
        assert image.any()
        patch = stored["patch"][rows]
        assert (patch[~image] == -1).all()
        if family in SIDES:  # one square grid per image, row by row
            within = np.arange(image.sum()) % SIDES[family] ** 2
            np.testing.assert_array_equal(patch[image], np.stack(
                [within // SIDES[family], within % SIDES[family]], 1))
        for layer in vision:
            np.testing.assert_allclose(stored[layer][n], sample[layer][0].numpy(),
                                       atol=1e-4, rtol=1e-4)
    with h5py.File(path) as f:
        assert list(f["modality"].attrs["values"]) == ["text", "image"]
        assert f["modality"].dtype == np.uint8 and f["patch"].shape[1] == 2
        assert [s.decode() for s in f["file"][:]] == [f"{n}.png" for n in range(6)]
        assert list(f[language]["output"].attrs["dims"]) == ["token", "feature"]


def test_qwen2_vl_patch_grid_follows_each_image(checkpoints, pairs, tmp_path):
    # the images have two sizes: each gets its own (rows, columns) of merged patches
    path = run_with(vlm_cfg(checkpoints("qwen2_vl"), pairs, tmp_path / "f.h5",
                            "layers=[model.language_model.layers.0]"))
    stored = _rows(path)
    bounds = stored["offsets"]
    shapes = set()
    for n in range(len(PROMPTS)):
        patch = stored["patch"][bounds[n]:bounds[n + 1]]
        image = stored["modality"][bounds[n]:bounds[n + 1]] == 1
        rows, columns = patch[image].max(0) + 1
        assert rows * columns == image.sum()
        expected = np.stack(np.divmod(np.arange(image.sum()), columns), 1)
        np.testing.assert_array_equal(patch[image], expected)
        shapes.add((int(rows), int(columns)))
    assert len(shapes) == 2


@pytest.mark.parametrize("family", list(PARTS))
def test_generation_rows_equal_the_teacher_forced_forward(family, checkpoints, pairs, tmp_path):
    folder = checkpoints(family)
    language = PARTS[family][0]
    path = run_with(vlm_cfg(folder, pairs, tmp_path / "g.h5", f"layers=[{language}]",
                            f"generate.max_new_tokens={NEW}", "generate.stop_at_eos=false"))
    stored = _rows(path)
    bounds = stored["offsets"]
    answers = [stored["input_ids"][a:b][stored["generated"][a:b]].tolist()
               for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    assert all(len(answer) == NEW for answer in answers)
    alone, _ = oracle(folder, pairs, [language], answers=answers)
    for n, sample in enumerate(alone):
        rows = slice(bounds[n], bounds[n + 1])
        np.testing.assert_array_equal(stored["input_ids"][rows], sample["input_ids"].numpy())
        np.testing.assert_allclose(stored[language][rows], sample[language][0].numpy(),
                                   atol=1e-4, rtol=1e-4)
        generated = stored["generated"][rows]
        assert (stored["modality"][rows][generated] == 0).all()
        assert (stored["patch"][rows][generated] == -1).all()
    with h5py.File(path) as f:
        assert len(f["completion"]) == len(PROMPTS)


def test_generation_keeps_vision_rows(checkpoints, pairs, tmp_path):
    # the vision tower runs once, on the prompt's image: a row per image as without generation
    folder = checkpoints("llava")
    language, vision, projector = PARTS["llava"]
    plain = run_with(vlm_cfg(folder, pairs, tmp_path / "f.h5", f"layers=[{vision},{projector}]"))
    generating = run_with(vlm_cfg(folder, pairs, tmp_path / "g.h5",
                                  f"layers=[{language},{vision},{projector}]",
                                  f"generate.max_new_tokens={NEW}"))
    a, b = _rows(plain), _rows(generating)
    for layer in (vision, projector):
        np.testing.assert_allclose(b[layer], a[layer], atol=1e-5)


def test_tokens_patches_on_the_vision_tower(checkpoints, pairs, tmp_path):
    folder = checkpoints("llava")
    vision = PARTS["llava"][1]
    path = run_with(vlm_cfg(folder, pairs, tmp_path / "p.h5", f"layers=[{vision}]",
                            "tokens=patches"))
    alone, _ = oracle(folder, pairs, [vision])
    stored = _rows(path)[vision]
    assert stored.shape == (len(PROMPTS), 32, 4, 4)  # (features, rows, columns), no class token
    expected = alone[0][vision][0, 1:].T.reshape(32, 4, 4)
    np.testing.assert_allclose(stored[0], expected.numpy(), atol=1e-4)


def test_prompt_with_its_own_placeholder_is_passed_as_it_is(checkpoints, tmp_path):
    from PIL import Image

    Image.new("RGB", (32, 32), "red").save(tmp_path / "red.png")
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"image": "red.png", "text": "look <image> here"}) + "\n")
    out = run_with(vlm_cfg(checkpoints("llava"), path, tmp_path / "f.h5",
                           "layers=[model.language_model.layers.0]"))
    with h5py.File(out) as f:
        assert f["modality"][:].sum() == 16
        assert f.attrs["chat_template"] == "true"
    out = run_with(vlm_cfg(checkpoints("llava"), path, tmp_path / "g.h5",
                           "layers=[model.language_model.layers.0]",
                           "dataset.chat_template=false"))
    with h5py.File(out) as f:  # no user turn around it
        assert len(f["input_ids"]) < 16 + 20


@pytest.mark.parametrize("overrides, message", [
    (["dataset=text"], "reads images with prompts, not text alone"),
    (["dataset=synthetic"], "reads images with prompts, not images alone"),
    (["layers=[vision_tower.encoder.layers.0]"], "vision_tower"),
])
def test_refusals(checkpoints, pairs, tmp_path, overrides, message):
    base = [f"dataset.path={tmp_path / 'docs.jsonl'}"] if overrides[0] == "dataset=text" else []
    (tmp_path / "docs.jsonl").write_text(json.dumps({"text": "the cat"}) + "\n")
    groups = [o for o in overrides if o.startswith("dataset=")]
    rest = [o for o in overrides if not o.startswith("dataset=")]
    cfg = compose_cfg("model=transformers", f"model.name={checkpoints('llava')}",
                      *(groups or ["dataset=pairs", f"dataset.path={pairs}"]), *base,
                      *(rest or ["layers=[model.language_model.layers.0]"]),
                      output=tmp_path / "f.h5")
    with pytest.raises(ConfigError, match=message):
        run_with(cfg)
    assert no_h5_files(tmp_path)


def test_vision_layers_refused_where_images_are_not_one_per_sample(checkpoints, pairs,
                                                                   tmp_path):
    with pytest.raises(ConfigError, match="5 images .or tiles. reach the vision tower for 1 "
                                          "sample"):
        run_with(vlm_cfg(checkpoints("idefics3_tiles"), pairs, tmp_path / "f.h5",
                         "layers=[model.vision_model.encoder.layers.0]"))
    with pytest.raises(ConfigError, match="as one sequence, with no axis of images"):
        run_with(vlm_cfg(checkpoints("qwen2_vl"), pairs, tmp_path / "f.h5",
                         "layers=[model.visual.blocks.0]"))
    assert no_h5_files(tmp_path)
    # their language model's rows are stored, tiles and all
    path = run_with(vlm_cfg(checkpoints("idefics3_tiles"), pairs, tmp_path / "t.h5",
                            "layers=[model.text_model.layers.0]"))
    with h5py.File(path) as f:
        assert (np.diff(f["offsets"][:]) > 5 * 4).all()
        image_rows = f["modality"][:].sum()
    assert image_rows == len(PROMPTS) * 5 * 4  # 5 tiles of 2x2 tokens each


def test_bad_samples(checkpoints, tmp_path):
    from PIL import Image

    Image.new("RGB", (32, 32), "red").save(tmp_path / "red.png")
    (tmp_path / "broken.png").write_bytes(b"not a png")
    folder, layers = checkpoints("llava"), "layers=[model.language_model.layers.0]"
    for rows, message in (
            ([("red.png", "one"), ("broken.png", "two")], r"sample 1 \(broken.png\) cannot be"),
            ([("red.png", "<image> and <image>")],
             r"sample 0 \(red.png\): its prompt holds 2 image placeholder\(s\) <image> for 1")):
        path = tmp_path / "pairs.jsonl"
        path.write_text("".join(json.dumps({"image": image, "text": text}) + "\n"
                                for image, text in rows))
        with pytest.raises(DataError, match=message):
            run_with(vlm_cfg(folder, path, tmp_path / "f.h5", layers))
        assert no_h5_files(tmp_path)


def test_skip_leaves_out_what_cannot_be_loaded(checkpoints, tmp_path):
    from PIL import Image

    Image.new("RGB", (32, 32), "red").save(tmp_path / "red.png")
    (tmp_path / "broken.png").write_bytes(b"not a png")
    rows = [{"image": "red.png", "text": "one"}, {"image": "broken.png", "text": "two"},
            {"image": "red.png", "text": "three"}]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = run_with(vlm_cfg(checkpoints("llava"), path, tmp_path / "f.h5",
                           "layers=[model.language_model.layers.0]", "dataset.on_error=skip"))
    with h5py.File(out) as f:
        assert f["index"][:].tolist() == [0, 2]
        assert f["skipped"][:].tolist() == [1]


def test_cli_lists_layers_by_part(checkpoints, pairs, tmp_path):
    done = cli("model=transformers", f"model.name={checkpoints('llava')}", "dataset=pairs",
               f"dataset.path={pairs}", cwd=tmp_path, module="probe.layers")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any("model.vision_tower.encoder.layers.1" in line and "vision" in line
               for line in lines)
    assert any("model.multi_modal_projector " in line and "projector" in line for line in lines)
    assert any("model.language_model.layers.1 " in line and "language" in line
               for line in lines)


def test_several_images_per_sample(checkpoints, tmp_path):
    from PIL import Image

    for n, color in enumerate(("red", "blue", "green")):
        Image.new("RGB", (32, 40), color).save(tmp_path / f"{n}.png")
    rows = [{"image": ["0.png", "1.png"], "text": "which is red"},
            {"image": ["2.png"], "text": "and this"}]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    folder, language = checkpoints("llava"), PARTS["llava"][0]
    out = run_with(vlm_cfg(folder, path, tmp_path / "f.h5", f"layers=[{language}]"))
    with h5py.File(out) as f:
        bounds, modality, patch = f["offsets"][:], f["modality"][:], f["patch"][:]
        files = [name.decode() for name in f["file"][:]]
    assert files == ["0.png;1.png", "2.png"]
    first = slice(bounds[0], bounds[1])
    image = modality[first] == 1
    assert image.sum() == 2 * 16 and modality[bounds[1]:].sum() == 16
    # each image's grid starts again at (0, 0)
    within = np.arange(32) % 16
    np.testing.assert_array_equal(patch[first][image], np.stack([within // 4, within % 4], 1))
    with pytest.raises(ConfigError, match="reach the vision tower for 1 sample"):
        run_with(vlm_cfg(folder, path, tmp_path / "g.h5", f"layers=[{PARTS['llava'][1]}]",
                         "limit=1"))


def test_a_layer_the_model_does_not_have(checkpoints, pairs, tmp_path):
    # Idefics3's name for the language model, on a LLaVA
    with pytest.raises(ConfigError, match="model.text_model.layers.0"):
        run_with(vlm_cfg(checkpoints("llava"), pairs, tmp_path / "f.h5",
                         "layers=[model.text_model.layers.0]"))
    assert no_h5_files(tmp_path)
