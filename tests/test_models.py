"""Building models: checkpoints that do not fit say why in one line, a DataParallel state_dict
loads, torchvision's weight names are listed once, and an offline download says what to do."""

from __future__ import annotations

import urllib.error

import pytest
import torch
import torchvision

from probe.errors import ConfigError, DataError
from probe.families.checkpoints import load_checkpoint
from probe.families.torchvision import torchvision_model


@pytest.fixture(scope="module")
def resnet18():
    torch.manual_seed(0)
    return torchvision.models.resnet18().eval()


@pytest.fixture(scope="module")
def vgg11_state():
    """A state_dict of another model than resnet18 (made once: vgg11 takes seconds)."""
    return torchvision.models.vgg11().state_dict()


def _one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_a_state_dict_of_another_model_names_the_keys(resnet18, vgg11_state, tmp_path):
    path = tmp_path / "vgg.pt"
    torch.save(vgg11_state, path)
    with pytest.raises(ConfigError) as err:
        load_checkpoint(torchvision.models.resnet18(), path)
    text = _one_line(err)
    assert ("is not a state_dict of this model: missing keys bn1.bias, bn1.num_batches_tracked, "
            "bn1.running_mean (and 119 more)") in text
    assert "unexpected keys classifier.0.bias" in text and "more)" in text


def test_a_dataparallel_state_dict_loads(resnet18, vgg11_state, tmp_path):
    path = tmp_path / "parallel.pt"
    torch.save({f"module.{k}": v for k, v in resnet18.state_dict().items()}, path)
    model = torchvision.models.resnet18()
    load_checkpoint(model, path)
    for name, value in resnet18.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    wrong = tmp_path / "parallel-vgg.pt"
    torch.save({f"module.{k}": v for k, v in vgg11_state.items()}, wrong)
    with pytest.raises(ConfigError, match=r"start with 'module.' \(saved from nn.DataParallel\) "
                                          "but do not match even without it"):
        load_checkpoint(model, wrong)


def test_another_variant_names_the_first_size_mismatch(tmp_path):
    path = tmp_path / "ten.pt"
    torch.save(torchvision.models.resnet18(num_classes=10).state_dict(), path)
    with pytest.raises(ConfigError, match=r"does not fit this model: size mismatch for fc.weight"):
        load_checkpoint(torchvision.models.resnet18(), path)


def test_corrupt_and_pickled_files_never_advise_weights_only_false(resnet18, tmp_path):
    corrupt = tmp_path / "corrupt.pt"
    torch.save(resnet18.state_dict(), corrupt)
    corrupt.write_bytes(corrupt.read_bytes()[:1000])
    with pytest.raises(DataError, match="cannot be read as a torch checkpoint") as err:
        load_checkpoint(torchvision.models.resnet18(), corrupt)
    assert "weights_only" not in _one_line(err)
    pickled = tmp_path / "model.pt"
    torch.save(resnet18, pickled)  # the whole module, not its state_dict
    with pytest.raises(ConfigError, match=r"holds a pickled torchvision.models.resnet.ResNet, "
                                          r"not a state_dict") as err:
        load_checkpoint(torchvision.models.resnet18(), pickled)
    assert "weights_only=False" not in _one_line(err)


def test_weight_names_are_listed_once():
    with pytest.raises(ConfigError) as err:
        torchvision_model("resnet18", "IMAGENET9K")
    assert _one_line(err).count("DEFAULT") == 1 and "IMAGENET1K_V1" in str(err.value)


def test_default_weights_offline_say_where_to_put_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))

    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", offline)
    with pytest.raises(DataError) as err:
        torchvision_model("resnet18", "DEFAULT")
    text = _one_line(err)
    assert "could not download https://download.pytorch.org/models/resnet18-f37072fd.pth" in text
    assert f"copy resnet18-f37072fd.pth into {tmp_path}/hub/checkpoints" in text
