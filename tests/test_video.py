"""Video: windows take exactly the frames the rule says (at the film's start and end too),
rows equal the model's output on those frames through its own processor, each window knows
its time, frames are decoded once, and bad input is one line. Videos are written here in FFV1
(lossless) with each frame showing its own index; tiny models made here; no downloads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import probe
from probe.errors import ConfigError, DataError
from tests.conftest import assert_same_datasets, interrupt_after, no_h5_files
from tests.tiny_video import decoded, frame_of, index_of, tiny_videomae, write_video

pytest.importorskip("av")
pytest.importorskip("transformers")

FPS = 10
LENGTHS = {"a/one.mkv": 25, "b/two.mkv": 17}  # frames: 2.5 s and 1.7 s at 10 fps
KEYS = ("index", "target", "file", "onset", "duration", "encoder.layer.1/output")


@pytest.fixture(scope="module")
def movies(tmp_path_factory):
    root = tmp_path_factory.mktemp("movies") / "movies"
    for n, (name, frames) in enumerate(LENGTHS.items()):
        write_video(root / name, frames, FPS, seed=n)
    return root


@pytest.fixture(scope="module")
def videomae(tmp_path_factory):
    return tiny_videomae(tmp_path_factory.mktemp("videomae"))


def expected_windows(frames: int, clip: float, step: float, take: int, align: str
                     ) -> list[tuple[float, list[int]]]:
    """The rule, computed independently in whole frames (clip and step are whole frames at
    FPS here): (time point, frames taken) of every window; a frame before 0 s is frame 0."""
    clip_f, step_f = round(clip * FPS), round(step * FPS)
    before = {"end": clip_f, "start": 0, "center": clip_f // 2}[align]
    found, k = [], 0
    while k * step_f - before + clip_f <= frames:
        start = k * step_f - before
        shown = [max(n, 0) for n in range(start, start + clip_f)]
        picks = np.round(np.linspace(0, len(shown) - 1, take)).astype(int)
        found.append((k * step / 1, [shown[i] for i in picks]))
        k += 1
    return found


def raw_frames(frames: torch.Tensor) -> torch.Tensor:
    return frames  # the transform of a test that looks at the decoded frames themselves


@pytest.mark.parametrize("align", ["end", "start", "center"])
@pytest.mark.parametrize("clip, step, take", [(1.0, 0.5, 4), (0.8, 0.3, 8), (0.4, 0.2, 4)])
def test_windows_take_the_frames_of_the_rule(movies, align, clip, step, take):
    from probe.data.video.clips import VideoDataset

    data = VideoDataset(root=str(movies), clip_seconds=clip, step_seconds=step, frames=take,
                        align=align, transform=raw_frames)
    want = [(name, *w) for name, n in LENGTHS.items()
            for w in expected_windows(n, clip, step, take, align)]
    assert len(data) == len(want)
    for i, (name, onset, frames) in enumerate(want):
        item = data[i]
        assert item["file"] == name
        assert item["onset"] == pytest.approx(onset)
        assert item["duration"] == pytest.approx(clip)
        assert [index_of(f) for f in item["video"].numpy()] == frames, (i, name, onset)
    # the first window of align=end lies wholly before 0 s: the first frame, repeated
    if align == "end":
        assert [index_of(f) for f in data[0]["video"].numpy()] == [0] * take


def test_each_frame_is_decoded_once_for_overlapping_windows(movies):
    from probe.data.video.clips import VideoDataset

    data = VideoDataset(root=str(movies), clip_seconds=1.0, step_seconds=0.1, frames=10,
                        transform=raw_frames)
    assert len(data) > 20  # windows overlapping nine tenths
    for i in range(len(data)):
        data[i]
    assert data.decoded_frames == sum(LENGTHS.values())  # every frame, once
    # asked out of order (a shard's), a window still gets its own frames
    assert [index_of(f) for f in data[3]["video"].numpy()] == expected_windows(
        25, 1.0, 0.1, 10, "end")[3][1]


def test_decoded_frames_are_the_files_own_pixels(movies):
    from probe.data.video.clips import VideoDataset

    data = VideoDataset(root=str(movies), clip_seconds=1.0, step_seconds=1.0, frames=10,
                        align="start", transform=raw_frames)
    frames = decoded(movies / "a/one.mkv")
    np.testing.assert_array_equal(data[1]["video"].numpy(), np.stack(frames[10:20]))
    np.testing.assert_array_equal(frames[7], frame_of(7, seed=0))  # lossless


def test_rows_equal_the_model_on_the_window_through_its_processor(make_cfg, movies, videomae,
                                                                  tmp_path):
    from transformers import AutoModel, AutoVideoProcessor

    path = probe.run(make_cfg("model=transformers", f"model.name={videomae}", "dataset=video",
                              f"dataset.root={movies}", "dataset.clip_seconds=1.0",
                              "dataset.step_seconds=0.5", "layers=[encoder.layer.1]",
                              "tokens=mean", "batch_size=3"))
    model = AutoModel.from_pretrained(videomae).eval()
    processor = AutoVideoProcessor.from_pretrained(videomae)
    captured = {}
    model.encoder.layer[1].register_forward_hook(
        lambda m, a, out: captured.__setitem__("x", out[0] if isinstance(out, tuple) else out))
    want = [(name, *w) for name, n in LENGTHS.items()
            for w in expected_windows(n, 1.0, 0.5, 4, "end")]
    with probe.open(path) as f:
        assert f.num_rows == len(want)
        assert f.attrs["frames"] == 4  # the model's num_frames
        np.testing.assert_allclose(f["onset"][:], [w[1] for w in want])
        np.testing.assert_allclose(f["duration"][:], 1.0)
        assert [str(x) for x in f["file"][:].astype(str)] == [w[0] for w in want]
        assert f["target"][:].tolist() == [0 if w[0].startswith("a/") else 1 for w in want]
        for row, (name, _, frames) in enumerate(want):
            every = decoded(movies / name)
            clip = np.stack([every[i] for i in frames])
            pixels = processor(videos=[clip], return_tensors="pt")["pixel_values"]
            with torch.no_grad():
                model(pixel_values=pixels)
            np.testing.assert_allclose(f["encoder.layer.1/output"][row],
                                       captured["x"][0].mean(0).numpy(), atol=1e-5)


@pytest.mark.parametrize("kind, stored", [("videomae", (32, 2, 2, 2)),
                                          ("timesformer", (32, 4, 2, 2))])
def test_patches_keep_the_grid_of_tubelets(make_cfg, movies, tmp_path, kind, stored):
    from transformers import AutoModel, AutoVideoProcessor

    model_dir = tiny_videomae(tmp_path / kind, kind=kind)
    path = probe.run(make_cfg("model=transformers", f"model.name={model_dir}", "dataset=video",
                              f"dataset.root={movies}", "dataset.clip_seconds=1.0",
                              "layers=[encoder.layer.0]", "tokens=patches", "limit=2"))
    model = AutoModel.from_pretrained(model_dir).eval()
    processor = AutoVideoProcessor.from_pretrained(model_dir)
    captured = {}
    model.encoder.layer[0].register_forward_hook(
        lambda m, a, out: captured.__setitem__("x", out[0] if isinstance(out, tuple) else out))
    with probe.open(path) as f:
        rows = f["encoder.layer.0/output"]
        assert rows.shape[1:] == stored
        assert list(rows.attrs["dims"]) == ["sample", "feature", "time", "height", "width"]
        every = decoded(movies / "a/one.mkv")
        frames = expected_windows(25, 1.0, 1.0, 4, "end")[1][1]
        pixels = processor(videos=[np.stack([every[i] for i in frames])],
                           return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            model(pixel_values=pixels)
        tokens = captured["x"][0]
        prefix = 1 if kind == "timesformer" else 0
        t, h, w = stored[1:]
        for time, row, column in [(0, 0, 0), (t - 1, 1, 0), (1, 0, 1)]:
            # time first (VideoMAE: tubelet, row, column) or last (TimeSformer)
            token = (prefix + (row * w + column) * t + time if kind == "timesformer"
                     else prefix + (time * h + row) * w + column)
            np.testing.assert_allclose(rows[1][:, time, row, column], tokens[token].numpy(),
                                       atol=1e-5)


@pytest.mark.slow  # r3d_18 at its own 16 x 112 x 112 clips: seconds on 2 cores
def test_a_torchvision_video_model_reads_its_own_clips(make_cfg, movies, tmp_path):
    import torchvision.models as tvm

    path = probe.run(make_cfg("model=torchvision", "model.name=r3d_18", "dataset=video",
                              f"dataset.root={movies}", "dataset.clip_seconds=1.6",
                              "dataset.align=start", "layers=[layer1]", "reduce=mean",
                              "limit=1"))
    torch.manual_seed(0)
    model = tvm.video.r3d_18().eval()
    every = decoded(movies / "a/one.mkv")
    frames = expected_windows(25, 1.6, 1.0, 16, "start")[0][1]
    clip = torch.from_numpy(np.stack([every[i] for i in frames])).permute(0, 3, 1, 2)
    preset = tvm.video.R3D_18_Weights.DEFAULT.transforms()
    captured = {}
    model.layer1.register_forward_hook(lambda m, a, out: captured.__setitem__("x", out))
    with torch.no_grad():
        model(preset(clip)[None])
    with probe.open(path) as f:
        assert f.attrs["frames"] == 16  # r3d_18's clip_len
        np.testing.assert_allclose(f["layer1/output"][0],
                                   captured["x"][0].mean((1, 2, 3)).numpy(), atol=1e-5)


def _video_run(model, movies, *extra):
    return ("model=transformers", f"model.name={model}", "dataset=video",
            f"dataset.root={movies}", "dataset.clip_seconds=1.0", "dataset.step_seconds=0.4",
            "layers=[encoder.layer.1]", "tokens=mean", *extra)


def test_shards_merge_into_the_unsharded_file(make_cfg, movies, videomae, tmp_path):
    from probe.file.merge import merge

    single = probe.run(make_cfg(*_video_run(videomae, movies, "batch_size=4"),
                                output=tmp_path / "single.h5"))
    shards = [probe.run(make_cfg(*_video_run(videomae, movies, "batch_size=4", "shard.count=2",
                                             f"shard.index={k}"), output=tmp_path / f"s{k}.h5"))
              for k in range(2)]
    merged = merge(tmp_path / "merged.h5", shards)
    with probe.open(merged) as many, probe.open(single) as one:
        order = np.argsort(many.index)
        assert many.index[order].tolist() == one.index.tolist()
        for key in ("onset", "duration", "encoder.layer.1/output"):
            np.testing.assert_allclose(many[key][:][order], one[key][:], atol=1e-6)


def test_an_interrupted_run_resumes_to_the_same_file(make_cfg, movies, videomae, tmp_path,
                                                     monkeypatch):
    overrides = _video_run(videomae, movies, "batch_size=3")
    whole = probe.run(make_cfg(*overrides, output=tmp_path / "whole.h5"))
    interrupt_after(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        probe.run(make_cfg(*overrides, output=tmp_path / "resumed.h5"))
    monkeypatch.undo()
    probe.run(make_cfg(*overrides, output=tmp_path / "resumed.h5"))
    assert_same_datasets(whole, tmp_path / "resumed.h5", KEYS)


def _garbage(root):
    (root / "a").mkdir(parents=True)
    (root / "a/x.mp4").write_bytes(b"not a video at all" * 10)


def _empty(root):
    (root / "a").mkdir(parents=True)
    (root / "a/x.mkv").write_bytes(b"")


def _short(root):
    write_video(root / "a/x.mkv", 5, FPS)  # 0.5 s


@pytest.mark.parametrize("make, extra, error, message", [
    (_garbage, [], DataError, r"^a/x.mp4 cannot be read as a video \(.*\); fix or remove it$"),
    (_empty, [], DataError, r"^a/x.mkv cannot be read as a video \(.*\); fix or remove it$"),
    (_short, [], ConfigError, r"^dataset.clip_seconds=2 is longer than a/x.mkv \(0.5 s\); use "
                              r"shorter windows, or leave the video out$"),
    (_short, ["dataset.clip_seconds=0.3", "dataset.frames=4"], ConfigError,
     r"^a window of a/x.mkv from -0.3 s to 0 s holds 3 frames \(the video has 10 frames per "
     r"second\), fewer than dataset.frames=4; take fewer frames, or longer windows$"),
    (_short, ["dataset.align=middle"], ConfigError, r"^dataset.align='middle': use end"),
    (_short, ["dataset.step_seconds=0"], ConfigError,
     r"^dataset.step_seconds=0 must be seconds, a number above 0$"),
    (lambda root: root.mkdir(), [], DataError, r"has no class subfolders"),
    (_short, ["dataset.path=videos.csv"], ConfigError,
     r"^dataset=video needs one of dataset.root \(a folder of files, or of one subfolder per "
     r"class\) or dataset.path"),
])
def test_bad_video_input_is_one_line_and_no_file(make_cfg, videomae, tmp_path, make, extra,
                                                 error, message):
    root = tmp_path / "videos"
    make(root)
    with pytest.raises(error, match=message) as failed:
        probe.run(make_cfg("model=transformers", f"model.name={videomae}", "dataset=video",
                           f"dataset.root={root}", "layers=[encoder.layer.1]", *extra))
    assert "\n" not in str(failed.value)
    assert no_h5_files(tmp_path)


def test_a_folder_of_films_without_classes(movies, tmp_path):
    from probe.data.video.clips import VideoDataset

    write_video(tmp_path / "films/one.mkv", 25, FPS)
    data = VideoDataset(root=str(tmp_path / "films"), clip_seconds=1.0, frames=4,
                        transform=raw_frames)
    assert data.files == ["one.mkv"] and not data.has_targets and data[0]["target"] == -1


def test_a_video_model_refuses_other_data_in_one_line(make_cfg, videomae, tmp_path):
    with pytest.raises(ConfigError, match=r"^VideoMAEModel is a video model: it reads windows "
                                          r"of video, not tensors; use dataset=video"):
        probe.run(make_cfg("model=transformers", f"model.name={videomae}",
                           "layers=[encoder.layer.1]"))
    assert no_h5_files(tmp_path)
