"""The command line, as a user types it, from a directory outside the repository."""

from __future__ import annotations

import textwrap

import h5py
import numpy as np

from tests.conftest import no_h5_files, run_cli

TINY = ["dataset.image_size=32", "dataset.num_samples=5", "batch_size=2"]


def test_main_job_writes_its_file_in_the_run_folder(tmp_path):
    result = run_cli("model=resnet18", "layers=[layer4]", *TINY, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    files = list((tmp_path / "outputs").rglob("features.h5"))
    assert len(files) == 1, result.stderr
    with h5py.File(files[0], "r") as f:
        assert f["layer4/output"].shape == (5, 512, 1, 1) and f.attrs["complete"]
    assert "wrote 5 rows" in result.stdout + result.stderr

    again = run_cli("model=resnet18", "layers=[layer4]", *TINY, cwd=tmp_path)
    assert again.returncode == 0 and "nothing to do" in again.stdout + again.stderr


def test_user_error_is_one_line_and_exit_1(tmp_path):
    result = run_cli("model=resnet18", "layers=[layer5]", *TINY, f"output.path={tmp_path}/f.h5",
                     cwd=tmp_path)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("probe: error:")]
    assert len(errors) == 1 and "layer5" in errors[0] and "Traceback" not in result.stderr
    assert no_h5_files(tmp_path)


def test_mistyped_key_fails_at_composition(tmp_path):
    result = run_cli("model=resnet18", "layers=[fc]", "batchsize=4", cwd=tmp_path)
    assert result.returncode == 1 and "batchsize" in result.stderr
    result = run_cli("model=resnet18", "layers=[fc]", "reduce=avg", cwd=tmp_path)
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
    result = run_cli("--config-dir", str(tmp_path / "my_conf"), "dataset=mine",
                     "model=resnet18", "layers=[fc]", f"output.path={tmp_path}/f.h5",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    with h5py.File(tmp_path / "f.h5", "r") as f:
        assert f["fc/output"].shape == (3, 1000)
        assert "target" not in f  # items are 1-tuples: no targets
        np.testing.assert_array_equal(f["index"][:], [0, 1, 2])


def test_list_layers(tmp_path):
    result = run_cli("model=vgg16", "dataset.image_size=32", cwd=tmp_path, module="probe.layers")
    assert result.returncode == 0, result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert "Conv2d" in lines["features.28"] and "(512, 2, 2)" in lines["features.28"]
    assert "8.0 KiB" in lines["features.28"]  # 512 * 2 * 2 float32 values
    assert list(tmp_path.iterdir()) == []  # listing writes nothing
    result = run_cli("model=vgg16", "dataset.image_size=32", "reduce=mean",
                     "reduce_by_layer={features.2*:none}", cwd=tmp_path, module="probe.layers")
    lines = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert "(512,)" in lines["features.19"] and "(512, 2, 2)" in lines["features.28"]


def test_run_folder_names_can_be_typed_back_unquoted():
    from probe.cli import run_folder_name

    assert run_folder_name("layers=[features.28],model=vgg16") == "layers-features.28+model-vgg16"
    assert run_folder_name("layers=[layer4.*,fc]") == "layers-layer4._+fc"
    assert run_folder_name("") == "default"
