"""Tiny videos and video models, made on the fly: no downloads. Videos are written with PyAV
in FFV1 (lossless, so every decoder gives the same pixels) and each frame shows its own index
(red = index % 256, green = index // 256); models and their video processors are saved with
save_pretrained in one folder. Import lazily (transformers takes seconds to import)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def frame_of(index: int, size: tuple[int, int] = (24, 32), seed: int | None = None
             ) -> np.ndarray:
    """(H, W, 3) uint8: frame ``index``, its index in the first two channels' top-left
    pixel block, the rest a seeded pattern (so that a model's outputs differ per frame)."""
    rng = np.random.default_rng(index if seed is None else seed * 100_003 + index)
    image = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
    image[:4, :4, 0] = index % 256
    image[:4, :4, 1] = index // 256
    image[:4, :4, 2] = 0
    return image


def index_of(frame: np.ndarray) -> int:
    """The index a decoded frame of ``write_video`` shows."""
    return int(frame[0, 0, 0]) + 256 * int(frame[0, 0, 1])


def write_video(path: Path, frames: int, fps: int = 10, size: tuple[int, int] = (24, 32),
                seed: int | None = None) -> Path:
    """``frames`` frames at ``fps``, FFV1 in Matroska (or rawvideo in AVI for .avi)."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        codec = "rawvideo" if path.suffix == ".avi" else "ffv1"
        stream = container.add_stream(codec, rate=fps)
        stream.height, stream.width = size
        stream.pix_fmt = "bgr24" if codec == "rawvideo" else "bgr0"
        for n in range(frames):
            frame = av.VideoFrame.from_ndarray(frame_of(n, size, seed), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def decoded(path: Path) -> list[np.ndarray]:
    """Every frame of a video, in order, as PyAV decodes it (RGB)."""
    import av

    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def tiny_videomae(directory: Path, *, frames: int = 4, size: int = 16, seed: int = 0,
                  kind: str = "videomae") -> Path:
    """A 2-layer video transformer, 32 wide, patches of 8 and its video processor (resize to
    ``size``, crop ``size``): ``kind`` videomae (tubelets of 2 frames, no class token),
    timesformer (a class token, time last) or vivit."""
    import torch
    import transformers as T

    torch.manual_seed(seed)
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64, image_size=size, num_frames=frames)
    config, model, processor = {
        "videomae": (T.VideoMAEConfig(patch_size=8, tubelet_size=2, **small),
                     T.VideoMAEModel, T.VideoMAEVideoProcessor),
        "timesformer": (T.TimesformerConfig(patch_size=8, **small),
                        T.TimesformerModel, T.TimesformerVideoProcessor),
        "vivit": (T.VivitConfig(tubelet_size=[2, 8, 8], **small),
                  T.VivitModel, T.VivitVideoProcessor),
    }[kind]
    model(config).eval().save_pretrained(directory)
    processor(size={"shortest_edge": size}, crop_size={"height": size, "width": size}
              ).save_pretrained(directory)
    return directory
