"""A probe file is right or refused: merged files without their shards, a dataset or model that
changed under the same config, a second writer, and keys that are not probe's."""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import socket
import sys
import textwrap

import h5py
import numpy as np
import pytest
import torch

import probe
from probe.analyses.fit import fit_probes
from probe.errors import DataError, OutputError, ProbeError
from probe.file.merge import merge
from probe.file.output import WriterLock
from tests.conftest import TINY_NET, interrupt_after, no_h5_files, run_with
from tests.tiny import TinyNet

RUN = [*TINY_NET, "layers=[features.0,fc]", "batch_size=2"]


def test_a_merged_file_without_its_shards_is_refused(make_cfg, tmp_path):
    shards = [probe.run(make_cfg(*RUN, "shard.count=2", f"shard.index={k}",
                                 output=tmp_path / f"shard{k}" / "features.h5"))
              for k in range(2)]
    merged = merge(tmp_path / "merged.h5", shards)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    lonely = shutil.copy(merged, elsewhere / "merged.h5")
    with pytest.raises(DataError, match=r"shard files that are not there: 'shard0/features.h5' "
                                        r"\(and 1 more\).*--copy"):
        probe.open(lonely)
    with pytest.raises(DataError, match="not there"):
        fit_probes(lonely)  # every command reads through the same check
    with h5py.File(lonely, "r") as f:  # plain h5py shows the gap instead of zeros
        assert np.isnan(f["fc/output"][:]).all()
    with probe.open(merged) as f:  # beside its shards it reads as before
        assert not np.isnan(f["fc/output"][:]).any()


def _image_folder(root, classes: int, per_class: int, size: int = 36):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size, size + 4 * i, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"class{c}" / f"{i}.png")
    return root


def test_a_dataset_that_changed_is_refused(make_cfg, tmp_path, monkeypatch):
    root = _image_folder(tmp_path / "images", classes=2, per_class=4)
    overrides = [*RUN, "dataset=imagefolder", f"dataset.root={root}", "dataset.image_size=32",
                 "output.commit_every=1"]
    interrupt_after(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        probe.run(make_cfg(*overrides))
    _image_folder(tmp_path / "images", classes=3, per_class=4)  # a class more, mid-run
    with pytest.raises(OutputError, match=r"the dataset changed since .* was started \(8 samples "
                                          r"then, 12 now; 8 files then, 12 now; the names or "
                                          r"sizes of its files differ\).*output.overwrite=true"):
        probe.run(make_cfg(*overrides))
    path = probe.run(make_cfg(*overrides, "output.overwrite=true"))
    (root / "class0" / "0.png").write_bytes((root / "class1" / "1.png").read_bytes())
    with pytest.raises(OutputError, match=r"was written \(the names or sizes of its files"):
        probe.run(make_cfg(*overrides))  # a finished file is not 'complete' for other data
    with probe.open(path) as f:
        assert f.num_rows == 12


def test_a_model_whose_code_or_weights_changed_is_refused(make_cfg, tmp_path, monkeypatch):
    source = tmp_path / "mynets.py"
    source.write_text(textwrap.dedent("""\
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv, self.fc = nn.Conv2d(3, 4, 3), nn.Linear(4, 10)

            def forward(self, x):
                return self.fc(self.conv(x).mean((2, 3)))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    overrides = ["model=custom", "model._target_=mynets.Net", "layers=[conv]"]
    probe.run(make_cfg(*overrides))
    # the same config, the module edited: the finished file no longer counts
    source.write_text(source.read_text().replace("x).mean((2, 3))", "x).amax((2, 3)))  # max"))
    sys.modules.pop("mynets")
    importlib.invalidate_caches()
    with pytest.raises(OutputError, match=r"the model changed .*the code of mynets\.Net changed"):
        probe.run(make_cfg(*overrides))
    # the same config and code, other weights (a model passed in, seeded otherwise)
    tiny = make_cfg(*TINY_NET, "layers=[fc]", output=tmp_path / "tiny.h5")
    probe.run(tiny)
    torch.manual_seed(1)
    with pytest.raises(OutputError, match=r"the model changed .*\(its weights differ\)"):
        run_with(tiny, model=TinyNet())


def test_no_second_writer_even_with_overwrite(make_cfg, tmp_path):
    path = tmp_path / "features.h5"
    with WriterLock(path):  # as another run that writes this file would
        for extra in ([], ["output.overwrite=true"]):
            with pytest.raises(OutputError, match=rf"process \d+ on {socket.gethostname()} is "
                                                  r"writing .*features\.h5.*wait for that run"):
                probe.run(make_cfg(*RUN, *extra))
    assert no_h5_files(tmp_path)
    probe.run(make_cfg(*RUN))
    assert not list(tmp_path.glob("*.lock"))  # released, and removed


def test_subset_random_takes_a_seeded_spread_in_dataset_order(make_cfg, tmp_path):
    def rows(*extra):
        name = "_".join(e.replace("=", "-") for e in extra) or "first"
        with probe.open(probe.run(make_cfg(*RUN, "dataset.num_samples=40", "limit=8", *extra,
                                           output=tmp_path / f"{name}.h5"))) as f:
            return f.index.tolist()

    assert rows() == list(range(8))
    spread = rows("subset=random")
    assert spread == sorted(spread) and len(set(spread)) == 8 and max(spread) >= 8
    assert rows("subset=random", "seed=0") == spread and rows("subset=random", "seed=1") != spread


def test_the_log_names_what_a_glob_matched_and_small_sizes_in_kib(make_cfg, caplog):
    with caplog.at_level(logging.INFO, logger="probe"):
        probe.run(make_cfg(*TINY_NET, "layers=[features.*]", "reduce=mean"))
    assert "layers: features.* matches features.0, features.1, features.2, features.3, " \
           "features.4" in caplog.text
    assert "samples of 240 B" in caplog.text  # (8 + 8 + 8 + 16 + 16) float32 + 16 bytes


def test_fit_warns_that_target_gradients_encode_the_label(make_cfg, caplog):
    path = probe.run(make_cfg(*TINY_NET, "layers=[fc]", "hooks=[forward,backward]",
                              "objective=target", "dataset.num_samples=12"))
    with caplog.at_level(logging.WARNING, logger="probe"):
        fit_probes(path, ["fc/output"], epochs=1)
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="probe"):
        fit_probes(path, ["fc/grad_output"], epochs=1)
    assert "computed from the label itself" in caplog.text


def test_fit_on_a_file_probe_did_not_write(tmp_path):
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["x"] = np.zeros((4, 3))
    with pytest.raises(DataError, match=r"is not a probe file \(it has no 'config' attribute\)"):
        fit_probes(tmp_path / "other.h5")


def test_a_folder_as_output_path_is_refused_before_any_compute(make_cfg, tmp_path):
    folder = tmp_path / "feats"
    folder.mkdir()
    with pytest.raises(OutputError, match=r"output.path=.*feats' is a folder; name a file in "
                                          r"it, e.g. output.path=.*feats/features.h5"):
        probe.plan(make_cfg(*RUN, output=folder))
    assert not any(folder.iterdir())


def test_what_a_stopped_run_left_unusable_is_removed_and_the_run_starts_again(
        make_cfg, tmp_path, caplog):
    path = tmp_path / "features.h5"
    (tmp_path / "features.h5.partial.new").write_bytes(b"\x89HDF\r\n\x1a\n")  # cut off mid-way
    (tmp_path / "features.h5.partial").write_bytes(b"\x89HDF\r\n")  # nothing readable
    with caplog.at_level(logging.WARNING):
        probe.run(make_cfg(*RUN))
    said = caplog.text
    assert "features.h5.partial.new (a run was stopped while it created it)" in said
    assert "features.h5.partial (it cannot be read" in said
    with probe.open(path) as f:
        assert f.num_rows == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["features.h5"]


def _mark_open_for_writing(path) -> None:
    # the superblock of a file whose SWMR writer was killed: status flags write + SWMR write
    from probe.file.partial import lookup3

    with open(path, "r+b") as stream:
        block = bytearray(stream.read(48))
        block[11] = 5
        block[44:48] = lookup3(bytes(block[:44])).to_bytes(4, "little")
        stream.seek(0)
        stream.write(block)


def test_a_complete_file_killed_before_its_rename_is_only_renamed(make_cfg, tmp_path, caplog):
    first = probe.run(make_cfg(*RUN))
    with h5py.File(first, "r") as f:
        values = f["fc/output"][:]
    partial = first.with_name("features.h5.partial")
    first.rename(partial)
    _mark_open_for_writing(partial)
    with pytest.raises(OSError, match="already open for write"):
        h5py.File(partial, "r")
    with caplog.at_level(logging.INFO):
        probe.run(make_cfg(*RUN))
    assert "is complete but was stopped before its rename; renaming it" in caplog.text
    with h5py.File(first, "r") as f:  # plain h5py, and so the C library's tools, open it
        np.testing.assert_array_equal(f["fc/output"][:], values)
    assert not partial.exists()


def test_a_file_being_written_says_by_whom(make_cfg, tmp_path, monkeypatch):
    cfg = make_cfg(*RUN, "output.commit_every=1")
    interrupt_after(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        probe.run(cfg)
    path = tmp_path / "features.h5"
    with WriterLock(path):
        with pytest.raises(OutputError, match=rf"not finished .*: process {os.getpid()} on "
                                              rf"{socket.gethostname()} is writing it"):
            probe.open(path)
        with probe.open(path, allow_partial=True) as f:  # its committed rows, while it writes
            assert f.num_rows == 4
    with pytest.raises(OutputError, match="its run was stopped before it finished"):
        probe.open(path)


@pytest.mark.parametrize(("overrides", "message"), [
    (["output.commit_every=0"], r"output.commit_every=0 must be at least 1"),
    (["output.commit_seconds=0"], r"output.commit_seconds=0.0 must be more than 0"),
    (["hooks=[backward]", "objective=nll"],
     r"objective=nll is a language model's next-token loss; .* use objective=top1 or target"),
    (["hooks=[backward]", "objective=similarity"],
     r"^objective=similarity is the matched image-text logit of a two-tower model; .* "
     r"\(similarity needs a CLIP-like model.name with dataset=pairs\)$"),
    (["model._target_=mylab.nets.Missing"],
     r"model._target_='mylab.nets.Missing' cannot be imported \(ModuleNotFoundError: No module "
     r"named 'mylab'\); install the package .* on PYTHONPATH$"),
])
def test_mistakes_are_one_precise_line(make_cfg, tmp_path, overrides, message):
    with pytest.raises(ProbeError, match=message) as refused:
        probe.run(make_cfg(*RUN, *overrides))
    assert "\n" not in str(refused.value)
    assert no_h5_files(tmp_path)


def test_a_limit_beyond_the_dataset_says_how_many_it_takes(make_cfg, caplog):
    with probe.open(probe.run(make_cfg(*RUN, "limit=10000"))) as f:
        assert f.num_rows == 6
    assert "limit=10000 is beyond the dataset's 6 samples: the run takes all 6" in caplog.text


def test_weights_that_are_not_a_checkpoint(make_cfg, tmp_path):
    notes = tmp_path / "notes.pt"
    notes.write_text("these are my notes\n")
    with pytest.raises(DataError, match=r"notes.pt' is not a torch checkpoint \(torch.save "
                                        r"writes a zip archive; this file starts with b'these "):
        probe.run(make_cfg("model=resnet18", "layers=[fc]", f"model.weights={notes}"))


def test_a_value_per_sample_whose_shape_follows_the_sample_is_one_line(make_cfg, tiny_lm,
                                                                      tmp_path):
    # an embedding's input is the token ids, (batch, length): no feature axis for a row per
    # token, and rows per sample of as many lengths as samples; found by the dry run
    pytest.importorskip("transformers")
    from probe.errors import ConfigError
    from tests.tiny_text import documents, write_jsonl

    corpus = write_jsonl(tmp_path / "docs.jsonl", documents(4, seed=1, low=3, high=9))
    cfg = make_cfg("model=transformers", f"model.name={tiny_lm}", "dataset=text",
                   f"dataset.path={corpus}", "layers=[transformer.wte]", "hooks=[forward_pre]")
    with pytest.raises(ConfigError) as caught:
        probe.run(cfg)
    said = str(caught.value)
    assert "\n" not in said and said.startswith("transformer.wte/input is (")
    assert "such as its output" in said
    assert no_h5_files(tmp_path)
