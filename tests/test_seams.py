"""The seams: model families and feeds are looked up, never switched on; the hooks need no
Hydra; group files leave every default to their factory; the core names no family or kind."""

from __future__ import annotations

import inspect
import re

import pytest
import yaml
from torch import nn

import probe
from probe.config import CONFIG_DIR
from probe.config.arguments import GROUP, factory_defaults
from probe.errors import ConfigError, OutputError
from probe.families import Family, family_for, register
from tests.conftest import REPO, TINY_NET, run_with
from tests.tiny import TinyNet

GROUP_FILES = sorted(CONFIG_DIR.glob("*/*.yaml"))


def test_two_families_with_one_name_is_an_error():
    class Mine(Family):
        name = "torchvision"

    import probe.families.torchvision  # noqa: F401  (registers the real one)

    with pytest.raises(ValueError, match="two model families are named 'torchvision'"):
        register(Mine())


def test_a_family_is_found_by_its_builder_or_its_classes_never_by_a_string():
    import torchvision

    from probe.families.torchvision import FAMILY as TORCHVISION

    by_target = family_for({"_target_": "probe.families.torchvision.torchvision_model"})
    assert by_target is TORCHVISION

    class Wrapped(nn.Module):  # a model of one's own, made of torchvision's classes
        def __init__(self):
            super().__init__()
            self.net = torchvision.models.resnet18()

    assert family_for({"_target_": "mylab.Wrapped"}, Wrapped()) is TORCHVISION
    plain = family_for({"_target_": "tests.tiny.TinyNet"}, TinyNet())
    assert type(plain) is Family


def test_a_user_model_of_vit_blocks_has_token_layouts(make_cfg, tmp_path):
    # found by its classes: a torchvision ViT inside a model of one's own
    import torchvision

    vit = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                               num_heads=2, hidden_dim=16, mlp_dim=32,
                                               num_classes=3).eval()
    cfg = make_cfg(*TINY_NET, "layers=[encoder.layers.encoder_layer_1]", "tokens=first")
    path = run_with(cfg, model=vit)
    with probe.open(path) as f:
        assert f["encoder.layers.encoder_layer_1/output"].shape == (6, 16)
        assert f.attrs["tokens"] == "first"


@pytest.mark.parametrize("path", GROUP_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_group_files_leave_every_default_to_their_factory(path):
    conf = yaml.safe_load(path.read_text()) or {}
    named = [e.split("/", 2)[2].split("@")[0] for e in conf.get("defaults", [])
             if isinstance(e, str) and e.startswith(f"/{GROUP}/")]
    if not named:  # model=custom: its _target_ is the user's
        assert set(conf) <= {"_target_"}
        return
    (target,) = named
    defaults = factory_defaults(target)
    repeated = {key for key, value in conf.items() if key in defaults and
                value == defaults[key] and not str(value).startswith("${")}
    assert not repeated, f"{path.name} repeats {target}'s defaults of {repeated}"
    # the defaults read from the source are the factory's own
    module, _, name = target.rpartition(".")
    factory = getattr(__import__(module, fromlist=[name]), name)
    real = {p.name: p.default for p in inspect.signature(factory).parameters.values()
            if p.default is not inspect.Parameter.empty}
    assert defaults == real


def test_a_group_key_is_typed_and_known(make_cfg):
    from hydra.errors import ConfigCompositionException

    assert make_cfg("dataset.image_size=40").dataset.image_size == 40  # not in the YAML
    with pytest.raises(ConfigCompositionException, match="image_sise"):
        make_cfg("dataset.image_sise=40")
    with pytest.raises(ConfigCompositionException, match="image_size"):
        make_cfg("dataset.image_size=large")


# family and modality words: what varies stands behind the seams, never in the core
_MODALITY = re.compile(r"\b(tokens?|texts?|vit|audio|frames?|images?|pixels?|patch(es)?|"
                       r"captions?|towers?|windows?|documents?|stream(s|ed|ing)?|offsets?|"
                       r"timm|transformers|language|vision)\b", re.I)
_CORE = ["pipeline/plan", "pipeline/dryrun", "pipeline/execute", "pipeline/hooks", "file/store",
         "file/writer"]


def _words(module: str, skip: str = "") -> list[str]:
    text = (REPO / "probe" / f"{module}.py").read_text()
    return [w[0] for w in _MODALITY.findall(text) if not re.fullmatch(skip, w[0], re.I)]


def test_the_core_names_no_family_and_no_kind_of_data():
    # what remains names the interface: the tokens key, its file attr
    words = {m: _words(m) for m in _CORE}
    assert sum(map(len, words.values())) <= 15, words


def test_the_per_key_transform_asks_the_layout():
    # besides the tokens= key's own name, the transform says nothing of what rows are
    assert len(_words("pipeline/keys", skip="tokens")) <= 8, _words("pipeline/keys")


def test_a_failure_in_the_writer_thread_is_one_line_and_the_file_resumes(
        make_cfg, tmp_path, monkeypatch):
    import probe.file.store

    cfg = make_cfg(*TINY_NET, "layers=[fc]", "batch_size=1", "output.commit_every=1")
    original, calls = probe.file.store.Store.append, []

    def append(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise PermissionError(13, "Permission denied")
        original(self, *args, **kwargs)

    monkeypatch.setattr(probe.file.store.Store, "append", append)
    with pytest.raises(OutputError, match=r"writing .*features.h5.partial' failed "
                                          r"\(PermissionError: .*Permission denied\): 3 rows are "
                                          "saved there; once the cause is gone, run the same "
                                          "command again to continue") as failed:
        probe.run(cfg)
    assert "\n" not in str(failed.value)
    monkeypatch.undo()
    probe.run(cfg)
    with probe.open(tmp_path / "features.h5") as f:
        assert f.index.tolist() == list(range(6))


def test_file_locking_reaches_every_hdf5_open(make_cfg, monkeypatch):
    import probe.file.output
    import probe.file.store

    seen = []
    for module in (probe.file.store, probe.file.output):
        name = "open_for_writing" if module is probe.file.store else "open_for_reading"
        original = getattr(module, name)

        def spy(path, locking=None, *args, _original=original, **kwargs):
            seen.append(locking)
            return _original(path, locking, *args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    cfg = make_cfg(*TINY_NET, "layers=[fc]", "output.file_locking=false")
    probe.run(cfg)
    probe.run(cfg)  # the finished file is read, too
    assert seen and set(seen) == {False}


def test_a_language_model_on_images_is_told_to_read_text(make_cfg, tiny_lm):
    with pytest.raises(ConfigError, match=r"GPT2LMHeadModel is a language model: it reads "
                                          r"text, not these inputs; add dataset=text "
                                          r"dataset.path="):
        probe.plan(make_cfg("model=transformers", f"model.name={tiny_lm}",
                            "layers=[transformer.h.0]"))


def test_layers_of_a_language_model_without_a_corpus(make_cfg, tiny_lm):
    from probe.pipeline.listing import layer_table

    rows = {row[0]: row for row in layer_table(make_cfg("model=transformers",
                                                        f"model.name={tiny_lm}"))[1][1:]}
    assert rows["transformer.h.0"][2] == "(32,)" and rows["transformer.h.0"][3] == "128 B"


def test_reduce_on_a_language_models_token_rows_points_at_tokens_mean(make_cfg, tiny_lm,
                                                                       tmp_path):
    from tests.tiny_text import documents, write_jsonl

    corpus = write_jsonl(tmp_path / "d.jsonl", documents(3))
    cfg = make_cfg("model=transformers", f"model.name={tiny_lm}", "dataset=text",
                   f"dataset.path={corpus}", "layers=[transformer.h.0]", "reduce=mean")
    with pytest.raises(ConfigError, match=r"reduce=mean on transformer.h.0/output, a token "
                                          r"layout whose rows are its tokens .* tokens=mean"):
        probe.run(cfg)
    pooled = probe.run(make_cfg("model=transformers", f"model.name={tiny_lm}", "dataset=text",
                                f"dataset.path={corpus}", "layers=[transformer.h.0]",
                                "reduce=mean", "tokens=mean", output=tmp_path / "mean.h5"))
    with probe.open(pooled) as f:  # the attr says what was done: the tokens were pooled
        assert f["transformer.h.0/output"].shape == (3, 32)
        assert f["transformer.h.0/output"].attrs["reduce"] == "none"
        assert f.attrs["tokens"] == "mean"


def test_objectives_come_from_the_family(make_cfg):
    with pytest.raises(ConfigError, match="objective='top5' is unknown; use top1, target"):
        probe.plan(make_cfg(*TINY_NET, "layers=[fc]", "hooks=[backward]", "objective=top5"))
