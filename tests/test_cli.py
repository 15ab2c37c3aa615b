"""The command line, as a user types it, from a directory outside the repository: the first test
in a fresh process, as typed; the others in this one (tests.cli), which sees the same."""

from __future__ import annotations

import os
import textwrap

import h5py
import numpy as np
import pytest

from tests.conftest import TINY_NET, cli, error_line, no_h5_files, run_cli

TINY = ["dataset.image_size=32", "dataset.num_samples=5", "batch_size=2"]


def test_main_job_writes_its_file_in_the_run_folder(tmp_path):
    result = run_cli("model=resnet18", "layers=[layer4]", *TINY, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    files = list((tmp_path / "outputs").rglob("features.h5"))
    assert len(files) == 1, result.stderr
    with h5py.File(files[0], "r") as f:
        assert f["layer4/output"].shape == (5, 512, 1, 1) and f.attrs["complete"]
    assert "wrote 5 rows" in result.stdout + result.stderr

    again = cli("model=resnet18", "layers=[layer4]", *TINY, cwd=tmp_path)
    assert again.returncode == 0 and "nothing to do" in again.stdout + again.stderr


def test_user_error_is_one_line_and_exit_1(tmp_path):
    result = cli(*TINY_NET, "layers=[fx]", *TINY, f"output.path={tmp_path}/f.h5",
                     cwd=tmp_path)
    assert "'fx' matches no module of the model. Closest: fc" in error_line(result)
    assert no_h5_files(tmp_path)


def test_mistyped_key_fails_at_composition(tmp_path):
    result = cli("model=resnet18", "layers=[fc]", "batchsize=4", cwd=tmp_path)
    assert result.returncode == 1 and "batchsize" in result.stderr
    result = cli("model=resnet18", "layers=[fc]", "reduce=avg", cwd=tmp_path)
    assert result.returncode == 1 and "mean" in result.stderr  # Hydra lists the valid values


def test_user_dataset_from_own_config_dir(tmp_path):
    conf = tmp_path / "my_conf" / "dataset"
    conf.mkdir(parents=True)
    (conf / "mine.yaml").write_text(textwrap.dedent("""\
        _target_: torch.utils.data.TensorDataset
        _args_:
          - _target_: torch.ones
            _args_: [3, 3, 32, 32]
    """))
    result = cli("--config-dir", str(tmp_path / "my_conf"), "dataset=mine", *TINY_NET,
                     "layers=[fc]", f"output.path={tmp_path}/f.h5", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    with h5py.File(tmp_path / "f.h5", "r") as f:
        assert f["fc/output"].shape == (3, 10)
        assert "target" not in f  # items are 1-tuples: no targets
        np.testing.assert_array_equal(f["index"][:], [0, 1, 2])


def test_list_layers(tmp_path):
    result = cli(*TINY_NET, "dataset.image_size=32", "reduce=mean",
                     "reduce_by_layer={features.3:none}", cwd=tmp_path, module="probe.layers")
    assert result.returncode == 0, result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert "Conv2d" in lines["features.3"] and "(16, 16, 16)" in lines["features.3"]
    assert "16.0 KiB" in lines["features.3"]  # 16 * 16 * 16 float32 values
    assert "(8,)" in lines["features.0"] and "32 B" in lines["features.0"]  # mean-pooled
    assert list(tmp_path.iterdir()) == []  # listing writes nothing


def test_run_folder_names_can_be_typed_back_unquoted():
    from probe.config.folders import run_folder_name

    assert run_folder_name("layers=[features.28],model=vgg16") == "layers-features.28+model-vgg16"
    # characters that the name cannot keep add a hash, so that names stay one-to-one
    assert run_folder_name("layers=[layer4.*,fc]").startswith("layers-layer4._+fc--")
    assert run_folder_name("layers=[features.1?]") != run_folder_name("layers=[features.1*]")
    assert run_folder_name("") == "default"


def test_a_long_run_folder_name_keeps_the_overrides_that_tell_shards_apart():
    from probe.config.folders import run_folder_name

    root = "/" + "/".join(["a-rather-long-folder-name"] * 12)
    names = [run_folder_name(f"dataset.root={root},model=resnet18,shard.count=4,"
                             f"shard.index={k}") for k in range(4)]
    for k, name in enumerate(names):
        assert len(name) <= 210 and name.endswith(f"+model-resnet18+shard.count-4+shard.index-{k}"
                                                  f"--{name[-8:]}"), name
        assert name.startswith("dataset.root-_a-rather-long-folder-name"), name
    assert len(set(names)) == 4


def test_a_failing_run_leaves_no_run_folder(tmp_path):
    # the model fails on the first sample: one line naming the module, and nothing left
    result = cli(*TINY_NET, "layers=[fc]", "dataset.image_size=1", cwd=tmp_path)
    line = error_line(result)
    assert "fails on one sample of shape (3, 1, 1) in features.2 (MaxPool2d)" in line
    assert "dataset.image_size" in line
    assert list(tmp_path.iterdir()) == []


def test_a_kept_run_folder_logs_the_error(tmp_path):
    # batch_size is not in the folder's name: both commands share the folder of the first
    ok = cli(*TINY_NET, "layers=[fc]", *TINY, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    (folder,) = (tmp_path / "outputs").iterdir()
    failed = cli(*TINY_NET, "layers=[fc]", *TINY, "batch_size=0", "output.overwrite=true",
                     cwd=tmp_path)
    assert "batch_size=0 must be at least 1" in error_line(failed)
    assert (folder / "features.h5").is_file()  # the earlier run's file and log stay
    assert "batch_size=0 must be at least 1" in (folder / "probe.log").read_text()


def test_a_read_only_working_directory_is_one_line(monkeypatch, capsys):
    from probe.commands import flags

    monkeypatch.setattr(flags.os, "access", lambda path, mode: False)
    with pytest.raises(SystemExit) as exit_info:
        flags.refuse_a_read_only_directory(["model=vgg16"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("probe: error: the current folder")
    assert "hydra.run.dir=" in err
    flags.refuse_a_read_only_directory(["hydra.run.dir=/elsewhere"])  # nothing to refuse


def test_overrides_with_long_absolute_paths(tmp_path, checkpoints):
    # two long absolute paths make a run folder name beyond the 255 bytes a file name may take
    from PIL import Image

    weights = tmp_path.joinpath("w" * 100, "x" * 100, "resnet18.pt")
    images = tmp_path.joinpath("i" * 100, "j" * 100, "images")
    weights.parent.mkdir(parents=True)
    os.link(checkpoints["resnet18"], weights)
    for label, colour in (("cat", "red"), ("dog", "blue")):
        (images / label).mkdir(parents=True)
        Image.new("RGB", (40, 36), colour).save(images / label / "a.png")
    args = ["model=resnet18", f"model.weights={weights}", "layers=[fc]", "dataset=imagefolder",
            f"dataset.root={images}", "dataset.image_size=32"]
    result = cli(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    files = list((tmp_path / "outputs").rglob("features.h5"))
    assert len(files) == 1
    name = files[0].parent.name
    assert len(name.encode()) <= 255 and len(name.rsplit("--", 1)[1]) == 8  # cut, hash kept
    again = cli(*args, cwd=tmp_path)  # the same command finds its folder
    assert again.returncode == 0 and "nothing to do" in again.stdout + again.stderr


def test_an_unknown_flag_is_one_line(tmp_path):
    for module in ("probe", "probe.layers"):
        result = cli("--foo", "model=resnet18", cwd=tmp_path, module=module)
        line = error_line(result)
        assert f"python -m {module} does not know the flag '--foo'" in line
        assert "--experimental-rerun" not in result.stderr  # not Hydra's whole usage
