"""probe's video capture (dataset=video) against a bare loop over the same windows, in one
process; frames decoded per run; peak memory of a fresh process on a movie and on one twice as
long.

    python benchmarks/bench_video.py                         # the issue's case (VideoMAE-base)
    python benchmarks/bench_video.py --small                 # 4 blocks of width 192: minutes
                                                             # on a 2-core CPU
    python benchmarks/bench_video.py --seconds 10 --repeat 1 # VideoMAE-base on a short movie
    python benchmarks/bench_video.py --device cuda           # on a GPU

A VideoMAE-base-shaped model with random weights (transformers' VideoMAEConfig defaults: 16
frames of 224 px, tubelets of 2 frames and 16 px, width 768, 12 blocks, 12 heads; ``--small``:
width 192, 4 blocks, 3 heads, MLP 768, the rest the same), saved with save_pretrained in a
temporary folder beside its VideoMAEVideoProcessor (the defaults: shortest edge 224, crop
224). A synthetic movie of ``--seconds`` (default 60) at 30 fps, 256 x 256, written with PyAV
(libx264, else mpeg4, else ffv1): a seeded blocky noise texture that drifts a few pixels a frame
under a moving bright bar. Windows of 4 s every 0.5 s, align=end (121 windows for 60 s), 16
frames each by probe's frame rule; probe stores the mean over tokens of the middle block's
output (``layers=[encoder.layer.<blocks // 2>]``, tokens=mean), in batches of
``--batch-size`` (default 8).

    capture   probe: dataset built from the config (probe.families.build.build_dataset: a
              VideoDataset with the model's own processor, headers demuxed) and
              probe.execute(probe.plan(cfg, model=model, dataset=dataset)), the HDF5 file
              written, the model loaded once beforehand (as bench_chat does); against a bare
              loop: a VideoDataset over the same movie and windows (the same decoder, PyAV
              through probe.data.video.decode, its transform the identity), the same
              AutoVideoProcessor called on each batch of windows (do_sample_frames=False), and
              model(pixel_values) under torch.inference_mode with one forward hook on the same
              block that takes the mean over tokens and stops the pass there (as probe's
              stop_early does), nothing written. Both build their dataset anew each run (the
              demux and the processor's loading are timed). Target: probe / bare <= 1.10;
              windows/s of each. The rows of the last runs are compared (max |difference|).
    decoding  frames decoded per run (VideoDataset.decoded_frames) against the frames in the
              movie: each frame decoded at most once.
    memory    the peak resident memory (VmHWM, benchmarks/peak.py; not getrusage's ru_maxrss,
              which on Linux carries over from the parent through fork and exec) of a fresh
              process that runs probe.run(compose(...)) on the movie and on one twice as long
              (``--memory-seconds``, default ``--seconds``): flat in the movie's length.

Medians of --repeat runs, the two sides alternating, after a warm-up of each. The machine may
be noisy: compare the ratios, and the load average (``uptime``) printed at the start and end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import suppress
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # before tqdm is imported: it reads this once
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import probe  # noqa: E402
from benchmarks.peak import peak_rss_mib  # noqa: E402
from probe.config.compose import compose  # noqa: E402

FPS, SIDE, CLIP, STEP = 30, 256, 4.0, 0.5
CODECS = ("libx264", "mpeg4", "ffv1")


def videomae(directory: Path, small: bool, seed: int = 0) -> Path:
    """The VideoMAE-base-shaped model (or the small one) and its video processor, saved in
    ``directory``."""
    from transformers import VideoMAEConfig, VideoMAEModel, VideoMAEVideoProcessor

    shape = (dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=3,
                  intermediate_size=768) if small else {})
    torch.manual_seed(seed)
    VideoMAEModel(VideoMAEConfig(**shape)).eval().save_pretrained(directory)
    VideoMAEVideoProcessor().save_pretrained(directory)
    return directory


def movie(path: Path, seconds: float, seed: int = 0) -> tuple[Path, str]:
    """A ``seconds`` long movie at FPS, SIDE x SIDE: a blocky noise texture drifting 3 px right
    and 1 px down a frame, and a bright bar sweeping across; and the codec it was written
    with (the first of CODECS that this FFmpeg can encode)."""
    import av

    codec = next(c for c in CODECS if _encodes(c))
    rng = np.random.default_rng(seed)
    texture = np.kron(rng.integers(0, 256, (2 * SIDE // 8, 2 * SIDE // 8, 3), dtype=np.uint8),
                      np.ones((8, 8, 1), dtype=np.uint8))  # 2 SIDE square, 8 px blocks
    path = path.with_suffix(".mkv" if codec == "ffv1" else ".mp4")
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=FPS)
        stream.height = stream.width = SIDE
        stream.pix_fmt = "yuv420p" if codec != "ffv1" else "bgr0"
        if codec != "ffv1":
            stream.bit_rate = 4_000_000
        for n in range(round(seconds * FPS)):
            dx, dy = (3 * n) % SIDE, n % SIDE
            image = texture[dy:dy + SIDE, dx:dx + SIDE].copy()
            bar = (5 * n) % SIDE
            image[:, bar:bar + 12] = 255
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path, codec


def _encodes(codec: str) -> bool:
    import av

    try:
        av.codec.Codec(codec, "w")
    except Exception:  # not built into this FFmpeg
        return False
    return True


def overrides(model_dir: Path, listing: Path, block: str, batch: int, out: Path,
              device: str) -> list[str]:
    return ["model=transformers", f"model.name={model_dir}", "dataset=video",
            f"dataset.path={listing}", f"dataset.clip_seconds={CLIP:g}",
            f"dataset.step_seconds={STEP:g}", "dataset.align=end", f"layers=[{block}]",
            "tokens=mean", f"batch_size={batch}", f"output.path={out}",
            "output.overwrite=true", f"device={device}"]


def listing_of(path: Path) -> Path:
    """A .csv list of the one movie (dataset.path)."""
    listed = path.with_name(path.stem + ".csv")
    listed.write_text(f"video\n{path.name}\n")
    return listed


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def probe_run(cfg, model, device: str) -> tuple[float, Path, int, int]:
    """Seconds of one capture (its dataset built anew), its file, the windows and the frames
    it decoded."""
    from probe.families.build import build_dataset

    _sync(device)
    started = time.perf_counter()
    dataset = build_dataset(cfg)
    path = Path(probe.execute(probe.plan(cfg, model=model, dataset=dataset)))
    _sync(device)
    return time.perf_counter() - started, path, len(dataset), dataset.decoded_frames


def _raw(frames: torch.Tensor) -> torch.Tensor:
    return frames  # the bare loop's VideoDataset gives the decoded (frames, H, W, 3) uint8


class _Done(Exception):
    """Raised by the bare loop's hook: the pass needs nothing after the block."""


def bare_run(model, model_dir: Path, listing: Path, block: str, batch: int, device: str
             ) -> tuple[float, int, int, torch.Tensor]:
    """Seconds, windows and frames decoded of the loop without probe, and its rows (each
    window's mean over tokens of ``block``'s output)."""
    from transformers import AutoVideoProcessor

    from probe.data.video.clips import VideoDataset

    rows: list[torch.Tensor] = []

    def mean(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        rows.append(hidden.mean(1))
        raise _Done

    handle = model.get_submodule(block).register_forward_hook(mean)
    try:
        _sync(device)
        started = time.perf_counter()
        processor = AutoVideoProcessor.from_pretrained(model_dir)
        data = VideoDataset(path=str(listing), clip_seconds=CLIP, step_seconds=STEP,
                            frames=model.config.num_frames, align="end", transform=_raw)
        with torch.inference_mode():
            for start in range(0, len(data), batch):
                clips = [data[i]["video"] for i in range(start, min(start + batch, len(data)))]
                pixels = processor(videos=clips, return_tensors="pt",
                                   do_sample_frames=False)["pixel_values"]
                with suppress(_Done):
                    model(pixel_values=pixels.to(device, non_blocking=True))
        found = torch.cat(rows).cpu()
        _sync(device)
        elapsed = time.perf_counter() - started
    finally:
        handle.remove()
    return elapsed, len(data), data.decoded_frames, found


_PEAK_RUN = """import sys; sys.path.insert(0, {repo!r})
import probe
from probe.config.compose import compose
probe.run(compose({overrides!r}))
"""


def _runs(values: list[float]) -> str:
    return f"[{', '.join(f'{x:.2f}' for x in values)}]"


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="the movie's length")
    parser.add_argument("--small", action="store_true",
                        help="width 192, 4 blocks, 3 heads (instead of VideoMAE-base's)")
    parser.add_argument("--repeat", "--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, ...")
    parser.add_argument("--memory-seconds", type=float, default=None,
                        help="the memory case's movie length L (L and 2 L; default --seconds)")
    parser.add_argument("--no-memory", dest="memory", action="store_false",
                        help="leave out the memory case (two more captures, of L and 2 L)")
    parser.add_argument("--dir", type=Path, default=None, help="where the files go")
    args = parser.parse_args()
    if args.seconds < CLIP:
        parser.error(f"--seconds must be at least a window's {CLIP:g} s")
    import logging

    logging.basicConfig(level=logging.WARNING)
    import av
    from transformers import AutoModel

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        tmp = Path(tmp)
        model_dir = videomae(tmp / "videomae", args.small)
        made = time.perf_counter()
        path, codec = movie(tmp / "movie", args.seconds)
        made = time.perf_counter() - made
        listing = listing_of(path)
        model = AutoModel.from_pretrained(model_dir).eval().to(args.device)
        config = model.config
        block = f"encoder.layer.{config.num_hidden_layers // 2}"
        frames_in_movie = round(args.seconds * FPS)
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device "
              f"{args.device}; PyAV {av.__version__}; VideoMAE-shaped"
              f"{' (--small)' if args.small else ''}: {config.num_hidden_layers} blocks of width "
              f"{config.hidden_size}, {config.num_frames} frames of {config.image_size} px, "
              f"tubelets of {config.tubelet_size}; {block} (tokens=mean); movie {args.seconds:g} s"
              f" at {FPS} fps, {SIDE}x{SIDE}, {codec}, {path.stat().st_size / 2**20:.1f} MiB "
              f"(written in {made:.1f} s); windows of {CLIP:g} s every {STEP:g} s (align=end), "
              f"batches of {args.batch_size}; median of {args.repeat}", flush=True)
        print(f"uptime at the start: {_uptime()}", flush=True)

        # 1. the capture against the bare loop
        cfg = compose(overrides(model_dir, listing, block, args.batch_size, tmp / "video.h5",
                                args.device))
        probe_run(cfg, model, args.device)  # warm-ups
        bare_run(model, model_dir, listing, block, args.batch_size, args.device)
        ours, base, decoded = [], [], set()
        for _ in range(args.repeat):  # alternately
            elapsed, windows, bare_decoded, rows = bare_run(model, model_dir, listing, block,
                                                            args.batch_size, args.device)
            base.append(elapsed)
            decoded.add(("bare loop", bare_decoded))
            elapsed, out, probe_windows, probe_decoded = probe_run(cfg, model, args.device)
            ours.append(elapsed)
            decoded.add(("probe", probe_decoded))
        with probe.open(out) as file:
            stored = np.asarray(file[f"{block}/output"][:])
        apart = float(np.abs(stored - rows.numpy()).max()) if stored.shape == rows.shape else None
        out.unlink()

        # 2. peak memory of a fresh process that runs the capture, on L and 2 L seconds
        peaks: dict[float, float] = {}
        if args.memory:
            length = args.memory_seconds or args.seconds
            for seconds in (length, 2 * length):
                if seconds == args.seconds:
                    listed = listing
                else:
                    listed = listing_of(movie(tmp / f"movie{seconds:g}", seconds)[0])
                code = _PEAK_RUN.format(repo=str(REPO), overrides=overrides(
                    model_dir, listed, block, args.batch_size, tmp / f"peak{seconds:g}.h5",
                    args.device))
                peaks[seconds] = peak_rss_mib(code)
                print(f"(memory: {seconds:g} s done)", flush=True)

        t_probe, t_bare = statistics.median(ours), statistics.median(base)
        ratio = t_probe / t_bare
        print(f"\n{'case':<20} {'windows':>7} {'seconds':>8} {'ratio':>6} {'windows/s':>10}  runs")
        print(f"{'capture: probe':<20} {probe_windows:7d} {t_probe:8.2f} {ratio:6.3f} "
              f"{probe_windows / t_probe:10.2f}  {_runs(ours)}")
        print(f"{'capture: bare loop':<20} {windows:7d} {t_bare:8.2f} {1:6.3f} "
              f"{windows / t_bare:10.2f}  {_runs(base)}")
        print(f"(rows of the last runs: max |probe - bare| = "
              f"{'shapes differ' if apart is None else f'{apart:.2e}'}, {stored.shape})")
        for side, count in sorted(decoded):
            print(f"decoding: {side:<10} {count:6d} frames decoded per run, {frames_in_movie} "
                  f"in the movie ({count / frames_in_movie:.3f} per frame)")
        for seconds, peak in peaks.items():
            print(f"memory: {seconds:g} s movie   peak {peak:8.0f} MiB (VmHWM of a fresh process)")

        checks = [("capture time, probe vs bare loop", ratio, 1.10)]
        checks += [(f"frames decoded per frame ({side})", count / frames_in_movie, 1.0)
                   for side, count in sorted(decoded)]
        if peaks:
            short, long = sorted(peaks)
            checks.append((f"peak memory, {long:g} s vs {short:g} s movie",
                           peaks[long] / peaks[short], 1.10))
            print(f"(peak growth for the 2x movie: {peaks[long] - peaks[short]:+.0f} MiB)")
        print("\ntargets (issue 46):")
        for label, value, target in checks:
            print(f"  {label:<40} {value:6.3f}  {'meets' if value <= target else 'MISSES'} "
                  f"<= {target:.2f}")
        print(f"uptime at the end: {_uptime()}", flush=True)


if __name__ == "__main__":
    main()
