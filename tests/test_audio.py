"""Speech encoders: every stored frame row equals what the model computes for that clip alone
through its own feature extractor, padding is never stored, sound is decoded, mixed to mono and
resampled to the extractor's rate, and bad inputs are one line. Tiny wav2vec2 and Whisper
models made here, sounds written with the stdlib wave module; no downloads."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

import probe
from probe.errors import ConfigError, DataError
from tests.conftest import assert_same_datasets, interrupt_after, no_h5_files
from tests.tiny_audio import clip_folder, read_wav, tiny_wav2vec2, tiny_whisper, tone, write_wav

pytest.importorskip("transformers")
pytest.importorskip("soundfile")
pytest.importorskip("soxr")

SECONDS = [0.5, 1.0, 0.3, 0.8, 1.2, 0.3, 0.7]  # two of 0.3 s: equal lengths can share a batch


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    return clip_folder(tmp_path_factory.mktemp("clips") / "clips", SECONDS)


@pytest.fixture(scope="module")
def wav2vec2(tmp_path_factory):
    return tiny_wav2vec2(tmp_path_factory.mktemp("wav2vec2"))


@pytest.fixture(scope="module")
def unmasked(tmp_path_factory):
    return tiny_wav2vec2(tmp_path_factory.mktemp("wav2vec2_base"), masked=False)


def audio_cfg(make_cfg, model, *overrides: str, output=None):
    return make_cfg("model=transformers", f"model.name={model}", "model.head=base",
                    "dataset=audio", *overrides, output=output)


def _files(root):
    return sorted(root.rglob("*.wav"), key=lambda p: (p.parent.name, p.name))


def _alone(model_dir, sounds, layer: int = 1, dtype: torch.dtype = torch.float32):
    """Each clip alone through transformers' own extractor and model (its weights and inputs
    in ``dtype``): hidden state ``layer`` (block layer-1's output) of each, (frames, width),
    as float32."""
    from transformers import AutoFeatureExtractor, AutoModel

    extractor = AutoFeatureExtractor.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, dtype=dtype).eval()
    states = []
    with torch.no_grad():
        for sound in sounds:
            inputs = extractor(sound, sampling_rate=16000, return_tensors="pt")
            inputs["input_values"] = inputs["input_values"].to(dtype)
            out = model(**inputs, output_hidden_states=True)
            states.append(out.hidden_states[layer][0].float().numpy())
    return states


@pytest.mark.parametrize("batch_size", [1, 3])
def test_every_frame_row_equals_the_clip_alone(make_cfg, wav2vec2, clips, batch_size):
    path = probe.run(audio_cfg(make_cfg, wav2vec2, f"dataset.root={clips}",
                               "layers=[encoder.layers.0]", f"batch_size={batch_size}"))
    files = _files(clips)
    want = _alone(wav2vec2, [read_wav(f)[0] for f in files])
    with probe.open(path) as f:
        offsets = f.offsets
        assert len(offsets) == len(files) + 1
        assert f.attrs["frame_rate"] == 400.0  # 16 kHz / (5 * 4 * 2) samples a frame
        assert f.attrs["sampling_rate"] == 16000 and f.attrs["tokens"] == "all"
        assert f["encoder.layers.0/output"].attrs["dims"].tolist() == ["frame", "feature"]
        assert f["file"][:].astype(str).tolist() == [str(p.relative_to(clips)) for p in files]
        assert f["target"][:].tolist() == [int(p.parent.name[1]) for p in files]
        for i, rows in enumerate(want):
            span = slice(offsets[i], offsets[i + 1])
            assert span.stop - span.start == len(rows)  # real frames only, never padding
            np.testing.assert_array_equal(f["positions"][span], np.arange(len(rows)))
            np.testing.assert_allclose(f["encoder.layers.0/output"][span], rows, atol=2e-5)


def test_mean_is_one_row_per_clip(make_cfg, wav2vec2, clips):
    path = probe.run(audio_cfg(make_cfg, wav2vec2, f"dataset.root={clips}", "tokens=mean",
                               "layers=[encoder.layers.0]", "batch_size=4"))
    want = _alone(wav2vec2, [read_wav(f)[0] for f in _files(clips)])
    with probe.open(path) as f:
        rows = f["encoder.layers.0/output"][:]
        assert rows.shape == (len(SECONDS), 32) and f.attrs["tokens"] == "mean"
        np.testing.assert_allclose(rows, np.stack([w.mean(0) for w in want]), atol=2e-5)


def test_a_model_without_a_mask_batches_only_clips_of_one_length(make_cfg, unmasked, clips,
                                                                  caplog):
    # group norm over time: a padded clip would give other values than the clip alone
    with caplog.at_level(logging.INFO):
        path = probe.run(audio_cfg(make_cfg, unmasked, f"dataset.root={clips}",
                                   "layers=[encoder.layers.1]", "batch_size=4",
                                   "bucket_by_length=true"))
    want = _alone(unmasked, [read_wav(f)[0] for f in _files(clips)], layer=2)
    with probe.open(path) as f:
        assert f.attrs["batching"] == "clips of equal length together, others alone"
        for i, rows in enumerate(want):
            span = slice(f.offsets[i], f.offsets[i + 1])
            np.testing.assert_allclose(f["encoder.layers.1/output"][span], rows, atol=2e-5)
    assert any("equal length" in r.getMessage() for r in caplog.records)


def test_other_rates_and_stereo_are_resampled_and_mixed(make_cfg, wav2vec2, tmp_path):
    import soxr

    root = tmp_path / "rates"
    write_wav(root / "a" / "at16k.wav", tone(1.0, 16000, seed=1), 16000)
    write_wav(root / "a" / "at8k.wav", tone(1.0, 8000, seed=2), 8000)
    write_wav(root / "a" / "stereo.wav", tone(0.6, 16000, seed=3, channels=2), 16000)
    path = probe.run(audio_cfg(make_cfg, wav2vec2, f"dataset.root={root}",
                               "layers=[encoder.layers.0]"))
    at16, _ = read_wav(root / "a" / "at16k.wav")
    at8, _ = read_wav(root / "a" / "at8k.wav")
    stereo, _ = read_wav(root / "a" / "stereo.wav")  # its channels averaged
    want = _alone(wav2vec2, [at16, soxr.resample(at8, 8000, 16000), stereo])
    with probe.open(path) as f:
        counts = np.diff(f.offsets)
        assert counts[0] == counts[1] == 398  # one second gives as many frames at either rate
        assert f.attrs["source_sampling_rates"].tolist() == [8000, 16000]
        assert f.attrs["resampled_files"] == 1 and f.attrs["resampler"] == "soxr"
        for i in (1, 2):
            span = slice(f.offsets[i], f.offsets[i + 1])
            np.testing.assert_allclose(f["encoder.layers.0/output"][span], want[i], atol=2e-5)


def test_a_csv_list_with_labels(make_cfg, wav2vec2, clips, tmp_path):
    files = _files(clips)[:3]
    listing = tmp_path / "clips.csv"
    listing.write_text("path,kind\n" + "".join(f"{p},{'dog' if n else 'cat'}\n"
                                                for n, p in enumerate(files)))
    path = probe.run(audio_cfg(make_cfg, wav2vec2, f"dataset.path={listing}",
                               "dataset.column=path", "dataset.label_column=kind",
                               "layers=[encoder.layers.0]", "tokens=first"))
    with probe.open(path) as f:
        assert f["target"][:].tolist() == [0, 1, 1]
        assert f.attrs["classes"].tolist() == ["cat", "dog"]


def test_whisper_stores_only_the_real_audio(make_cfg, tmp_path):
    from transformers import AutoFeatureExtractor, WhisperModel

    model_dir = tiny_whisper(tmp_path / "whisper", seconds=2)
    root = tmp_path / "speech"
    for n, seconds in enumerate([0.5, 1.3, 2.0]):
        write_wav(root / "x" / f"{n}.wav", tone(seconds, seed=n))
    path = probe.run(audio_cfg(make_cfg, model_dir, f"dataset.root={root}", "batch_size=2",
                               "layers=[encoder.layers.0]"))
    extractor = AutoFeatureExtractor.from_pretrained(model_dir)
    encoder = WhisperModel.from_pretrained(model_dir).eval().get_encoder()
    with probe.open(path) as f:
        assert f.attrs["frame_rate"] == 50.0  # 100 spectrogram frames a second, halved
        for i, seconds in enumerate([0.5, 1.3, 2.0]):
            sound, _ = read_wav(root / "x" / f"{i}.wav")
            features = extractor(sound, sampling_rate=16000, return_tensors="pt")
            assert features.input_features.shape[-1] == 200  # padded to its 2 s window
            with torch.no_grad():  # the encoder on the padded input, as Whisper always runs
                states = encoder(features.input_features, output_hidden_states=True)
            padded = states.hidden_states[1][0].numpy()  # block 0's output, (100, 32)
            span = slice(f.offsets[i], f.offsets[i + 1])
            assert span.stop - span.start == round(seconds * 50)  # the real audio's frames
            np.testing.assert_allclose(f["encoder.layers.0/output"][span],
                                       padded[: round(seconds * 50)], atol=2e-5)


def _not_audio(tmp_path):
    (tmp_path / "d" / "a").mkdir(parents=True)
    (tmp_path / "d" / "a" / "x.wav").write_text("not a sound")
    return [f"dataset.root={tmp_path / 'd'}"]


def _empty_file(tmp_path):
    (tmp_path / "d" / "a").mkdir(parents=True)
    (tmp_path / "d" / "a" / "x.wav").write_bytes(b"")
    return [f"dataset.root={tmp_path / 'd'}"]


def _no_samples(tmp_path):
    write_wav(tmp_path / "d" / "a" / "x.wav", np.zeros((0, 1)))
    return [f"dataset.root={tmp_path / 'd'}"]


def _missing_column(tmp_path):
    (tmp_path / "clips.jsonl").write_text(json.dumps({"file": "x.wav"}) + "\n")
    return [f"dataset.path={tmp_path / 'clips.jsonl'}"]


@pytest.mark.parametrize("make, error, message", [
    (_not_audio, DataError, r"dataset sample 0 \(a/x.wav\) cannot be loaded \(LibsndfileError"),
    (_empty_file, DataError, r"dataset sample 0 \(a/x.wav\) cannot be loaded"),
    (_no_samples, DataError, r"dataset sample 0 \(a/x.wav\) cannot be loaded \(ValueError: it "
                             r"holds no samples\)"),
    (_missing_column, ConfigError, r"dataset.column='audio' is not a column of .*; it has file"),
    (lambda p: [], ConfigError, r"dataset=audio needs one of dataset.root"),
])
def test_bad_audio_input_is_one_line_and_no_file(make_cfg, wav2vec2, tmp_path, make, error,
                                                 message):
    with pytest.raises(error, match=message) as failed:
        probe.run(audio_cfg(make_cfg, wav2vec2, "layers=[encoder.layers.0]", *make(tmp_path)))
    assert "\n" not in str(failed.value)
    assert no_h5_files(tmp_path)


def test_models_and_data_that_do_not_fit_are_one_line(make_cfg, wav2vec2, clips, tiny_lm,
                                                      tmp_path):
    with pytest.raises(ConfigError, match=r"Wav2Vec2Model is an audio model: it reads sound, "
                                          r"not these inputs; add dataset=audio"):
        probe.run(make_cfg("model=transformers", f"model.name={wav2vec2}", "model.head=base",
                           "layers=[encoder.layers.0]"))
    with pytest.raises(ConfigError, match=r"GPT2LMHeadModel is a language model: it reads "
                                          r"text, not these inputs"):
        probe.run(make_cfg("model=transformers", f"model.name={tiny_lm}", "dataset=audio",
                           f"dataset.feature_extractor={wav2vec2}", f"dataset.root={clips}",
                           "layers=[transformer.h.0]"))
    with pytest.raises(ConfigError, match=r"dataset.feature_extractor=.* cannot be loaded .*use "
                                          r"a speech or audio model"):
        probe.run(make_cfg("model=transformers", f"model.name={tiny_lm}", "dataset=audio",
                           f"dataset.root={clips}", "layers=[transformer.h.0]"))
    assert no_h5_files(tmp_path)


def test_windows_of_a_long_recording_are_stitched(make_cfg, tmp_path):
    from transformers import AutoModel

    # no per-clip normalisation, so the convolutional stem sees the same samples either way
    model_dir = tiny_wav2vec2(tmp_path / "plain", normalize=False)
    write_wav(tmp_path / "long" / "a" / "story.wav", tone(3.0, seed=5))
    run = ["layers=[feature_projection,encoder.layers.1]", f"dataset.root={tmp_path / 'long'}"]
    whole = probe.run(audio_cfg(make_cfg, model_dir, *run, output=tmp_path / "whole.h5"))
    windowed = probe.run(audio_cfg(make_cfg, model_dir, *run, "dataset.window_seconds=1",
                                   "dataset.stride_seconds=0.5", output=tmp_path / "win.h5"))
    pooled = probe.run(audio_cfg(make_cfg, model_dir, *run, "dataset.window_seconds=1",
                                 "tokens=mean", output=tmp_path / "mean.h5"))
    sound, _ = read_wav(tmp_path / "long" / "a" / "story.wav")
    model = AutoModel.from_pretrained(model_dir).eval()
    with probe.open(whole) as a, probe.open(windowed) as b, probe.open(pooled) as c:
        assert b.offsets.tolist() == [0, 1198] == a.offsets.tolist()  # each frame once
        np.testing.assert_array_equal(b["positions"][:], np.arange(1198))
        assert b.attrs["window_seconds"] == 1.0 and b.attrs["stride_seconds"] == 0.5
        # the stem's frames see 10 ms of sound: the same with or without windows
        np.testing.assert_allclose(b["feature_projection/output"][:],
                                   a["feature_projection/output"][:], atol=1e-5)
        rows = b["encoder.layers.1/output"][:]
        # the attention sees one window: a frame in the middle half of window k is window k's
        for k, start in enumerate(range(0, 801, 200)):
            with torch.no_grad():
                alone = model(torch.from_numpy(sound[start * 40:start * 40 + 16000])[None],
                              output_hidden_states=True).hidden_states[2][0].numpy()
            low, high = (0 if k == 0 else 100), (398 if k == 4 else 299)
            np.testing.assert_allclose(rows[start + low:start + high], alone[low:high],
                                       atol=2e-5)
        np.testing.assert_allclose(c["encoder.layers.1/output"][0],
                                   _mean_of_windows(model, sound), atol=2e-5)


def _mean_of_windows(model, sound):
    # stride 0.5 s by default: windows every 200 frames, each frame from its most central
    rows = np.zeros((1198, 32), np.float32)
    for k, start in enumerate(range(0, 801, 200)):
        with torch.no_grad():
            alone = model(torch.from_numpy(sound[start * 40:start * 40 + 16000])[None],
                          output_hidden_states=True).hidden_states[2][0].numpy()
        low, high = (0 if k == 0 else 99), (398 if k == 4 else 299)
        rows[start + low:start + high] = alone[low:high]
    return rows.mean(0)


def _layer_grads(model, inputs, layer: str, loss_of) -> np.ndarray:
    """d loss / d (layer's output) of one clip, by torch.autograd.grad."""
    seen = {}
    handle = model.get_submodule(layer).register_forward_hook(
        lambda m, a, out: seen.setdefault("out", out[0] if isinstance(out, tuple) else out))
    try:
        loss = loss_of(model(**inputs))
        (grad,) = torch.autograd.grad(loss, seen["out"])
    finally:
        handle.remove()
    return grad[0].numpy()


@pytest.mark.parametrize("objective", ["top1", "target"])
def test_classification_gradients_are_each_clips_own(make_cfg, clips, tmp_path, objective):
    from transformers import AutoFeatureExtractor, AutoModelForAudioClassification

    model_dir = tiny_wav2vec2(tmp_path / "classifier", head="audio_classification")
    layer = "wav2vec2.encoder.layers.0"
    path = probe.run(make_cfg("model=transformers", f"model.name={model_dir}",
                              "model.head=audio_classification", "dataset=audio",
                              f"dataset.root={clips}", f"layers=[{layer}]", "batch_size=3",
                              "hooks=[forward,backward]", f"objective={objective}"))
    extractor = AutoFeatureExtractor.from_pretrained(model_dir)
    model = AutoModelForAudioClassification.from_pretrained(model_dir).eval()
    with probe.open(path) as f:
        assert f.attrs["objective"] == objective
        for i, file in enumerate(_files(clips)):
            inputs = extractor(read_wav(file)[0], sampling_rate=16000, return_tensors="pt")
            target = int(f["target"][i])
            want = _layer_grads(model, inputs, layer, lambda out, t=target: (
                out.logits[0].max() if objective == "top1" else out.logits[0, t]))
            span = slice(f.offsets[i], f.offsets[i + 1])
            np.testing.assert_allclose(f[f"{layer}/grad_output"][span], want, rtol=1e-3,
                                       atol=1e-5)


def test_ctc_nll_gradients_score_each_transcript(make_cfg, clips, tmp_path):
    from transformers import AutoFeatureExtractor, AutoModelForCTC, AutoTokenizer

    from tests.tiny_audio import ctc_tokenizer

    model_dir = ctc_tokenizer(tiny_wav2vec2(tmp_path / "ctc", head="ctc"))
    files = _files(clips)[:4]
    texts = ["abc", "bad cab", "a", "hide"]
    listing = tmp_path / "speech.jsonl"
    listing.write_text("".join(json.dumps({"audio": str(p), "text": t}) + "\n"
                               for p, t in zip(files, texts, strict=True)))
    layer = "wav2vec2.encoder.layers.1"
    path = probe.run(make_cfg("model=transformers", f"model.name={model_dir}", "model.head=ctc",
                              "dataset=audio", f"dataset.path={listing}",
                              "dataset.transcript_column=text", f"layers=[{layer}]",
                              "batch_size=4", "hooks=[backward]", "objective=nll"))
    extractor = AutoFeatureExtractor.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCTC.from_pretrained(model_dir).eval()  # ctc_loss_reduction=sum
    with probe.open(path) as f:
        assert f["transcript"][:].astype(str).tolist() == texts
        for i, (file, text) in enumerate(zip(files, texts, strict=True)):
            inputs = extractor(read_wav(file)[0], sampling_rate=16000, return_tensors="pt")
            labels = torch.tensor([tokenizer(text).input_ids])
            want = _layer_grads(model, {**inputs, "labels": labels}, layer, lambda out: out.loss)
            span = slice(f.offsets[i], f.offsets[i + 1])
            np.testing.assert_allclose(f[f"{layer}/grad_output"][span], want, rtol=1e-3,
                                       atol=1e-5)


@pytest.fixture(scope="module")
def many_clips(tmp_path_factory):
    rng = np.random.default_rng(3)
    return clip_folder(tmp_path_factory.mktemp("many") / "clips",
                       [float(s) for s in rng.uniform(0.05, 0.4, 20).round(2)])


def _many(wav2vec2, many_clips, *overrides):
    return ["model=transformers", f"model.name={wav2vec2}", "model.head=base", "dataset=audio",
            f"dataset.root={many_clips}", "layers=[encoder.layers.0]", "output.commit_every=1",
            *overrides]

AUDIO_KEYS = ("index", "target", "offsets", "positions", "file", "encoder.layers.0/output")


def test_bucketed_batches_give_the_same_rows_with_less_padding(make_cfg, wav2vec2, many_clips,
                                                               tmp_path):
    plain = probe.run(make_cfg(*_many(wav2vec2, many_clips, "batch_size=1"),
                               output=tmp_path / "plain.h5"))
    bucketed = probe.run(make_cfg(*_many(wav2vec2, many_clips, "batch_size=4",
                                         "bucket_by_length=true"), output=tmp_path / "b.h5"))
    assert_same_datasets(plain, bucketed, AUDIO_KEYS[:-1])
    with probe.open(plain) as a, probe.open(bucketed) as b:
        np.testing.assert_allclose(b["encoder.layers.0/output"][:],
                                   a["encoder.layers.0/output"][:], atol=2e-5)


@pytest.mark.parametrize("extra, stop_after, kept", [
    (["batch_size=2", "bucket_by_length=false"], 3, 6),
    pytest.param(["batch_size=1", "bucket_by_length=true"], 17, 16,  # a group of 16 kept
                 marks=pytest.mark.slow),
])
def test_an_interrupted_run_resumes_to_the_same_file(make_cfg, wav2vec2, many_clips, tmp_path,
                                                     monkeypatch, extra, stop_after, kept):
    overrides = _many(wav2vec2, many_clips, *extra)
    whole = probe.run(make_cfg(*overrides, output=tmp_path / "whole.h5"))
    interrupt_after(monkeypatch, stop_after)
    with pytest.raises(KeyboardInterrupt):
        probe.run(make_cfg(*overrides, output=tmp_path / "resumed.h5"))
    with probe.open(tmp_path / "resumed.h5", allow_partial=True) as f:
        assert f.num_rows == kept
    probe.run(make_cfg(*overrides, output=tmp_path / "resumed.h5"))
    assert_same_datasets(whole, tmp_path / "resumed.h5", AUDIO_KEYS)


def test_shards_merge_into_one_run(make_cfg, wav2vec2, many_clips, tmp_path):
    from probe.file.merge import merge

    single = probe.run(make_cfg(*_many(wav2vec2, many_clips, "batch_size=2"),
                                output=tmp_path / "single.h5"))
    shards = [probe.run(make_cfg(*_many(wav2vec2, many_clips, "batch_size=2", "shard.count=3",
                                        f"shard.index={k}"), output=tmp_path / f"s{k}.h5"))
              for k in range(3)]
    merged = merge(tmp_path / "merged.h5", shards)
    with probe.open(merged) as many, probe.open(single) as one:
        assert many.attrs["frame_rate"] == one.attrs["frame_rate"]
        order = np.argsort(many.index)
        assert many.index[order].tolist() == one.index.tolist()
        for i, row in enumerate(order):
            a = many["encoder.layers.0/output"][many.offsets[row]:many.offsets[row + 1]]
            b = one["encoder.layers.0/output"][one.offsets[i]:one.offsets[i + 1]]
            np.testing.assert_allclose(a, b, atol=2e-5)


def test_loader_workers_give_the_same_file(make_cfg, wav2vec2, clips, tmp_path):
    # the model's length function travels to the workers with the feed
    run = [f"dataset.root={clips}", "layers=[encoder.layers.0]", "batch_size=3"]
    alone = probe.run(audio_cfg(make_cfg, wav2vec2, *run, output=tmp_path / "a.h5"))
    workers = probe.run(audio_cfg(make_cfg, wav2vec2, *run, "num_workers=2",
                                  output=tmp_path / "w.h5"))
    assert_same_datasets(alone, workers, ("index", "offsets", "positions", "file",
                                          "encoder.layers.0/output"))


@pytest.mark.parametrize("overrides, message", [
    (["hooks=[backward]", "objective=target"], r"objective=target needs model.head="
                                               r"audio_classification or sequence_classification"
                                               r", but the model has no head \(Wav2Vec2Model\)"),
    (["dataset.window_seconds=0.5", "dataset.stride_seconds=0.6"],
     r"dataset.stride_seconds=0.6 must be above 0 and at most dataset.window_seconds=0.5"),
    (["dataset.window_seconds=0"],
     r"^dataset.window_seconds=0 must be above 0 \(seconds of sound per window\), or null "
     r"for whole clips$"),
    (["dataset.window_seconds=0.5", "hooks=[backward]", "objective=top1"],
     r"objective=top1 needs model.head"),
])
def test_audio_refusals_are_one_line(make_cfg, wav2vec2, clips, tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message) as failed:
        probe.run(audio_cfg(make_cfg, wav2vec2, f"dataset.root={clips}",
                            "layers=[encoder.layers.0]", *overrides))
    assert "\n" not in str(failed.value) and no_h5_files(tmp_path)


def test_windows_refuse_an_extractor_without_a_mask(make_cfg, unmasked, clips, tmp_path):
    with pytest.raises(ConfigError, match=r"dataset.window_seconds needs a feature extractor "
                                          r"that gives the model an attention mask"):
        probe.run(audio_cfg(make_cfg, unmasked, f"dataset.root={clips}",
                            "layers=[encoder.layers.0]", "dataset.window_seconds=0.5"))
    assert no_h5_files(tmp_path)


def test_a_bad_file_is_left_out_with_on_error_skip(make_cfg, wav2vec2, clips, tmp_path):
    import shutil

    root = tmp_path / "some"
    shutil.copytree(clips, root)
    (root / "c0" / "02.wav").write_bytes(b"RIFF broken")
    path = probe.run(audio_cfg(make_cfg, wav2vec2, f"dataset.root={root}", "batch_size=2",
                               "dataset.on_error=skip", "layers=[encoder.layers.0]"))
    with probe.open(path) as f:
        assert f["skipped"][:].tolist() == [1]  # c0/02.wav is the second file
        assert len(f.index) == len(SECONDS) - 1 and f.offsets[-1] == len(f["positions"])
        assert "c0/02.wav" not in f["file"][:].astype(str).tolist()


@pytest.mark.parametrize("kind", ["hubert", "wavlm"])
def test_hubert_and_wavlm_frames_equal_each_clip_alone(make_cfg, clips, tmp_path, kind):
    from tests.tiny_audio import tiny_encoder

    model_dir = tiny_encoder(tmp_path / kind, kind)
    path = probe.run(audio_cfg(make_cfg, model_dir, f"dataset.root={clips}", "batch_size=4",
                               "layers=[encoder.layers.0]"))
    want = _alone(model_dir, [read_wav(f)[0] for f in _files(clips)])
    with probe.open(path) as f:
        assert f.attrs["frame_rate"] == 400.0
        for i, rows in enumerate(want):
            span = slice(f.offsets[i], f.offsets[i + 1])
            np.testing.assert_allclose(f["encoder.layers.0/output"][span], rows, atol=2e-5)


def test_whisper_windows_are_stitched_from_each_window_alone(make_cfg, tmp_path):
    from transformers import AutoFeatureExtractor, WhisperModel

    model_dir = tiny_whisper(tmp_path / "whisper", seconds=2)
    write_wav(tmp_path / "long" / "a" / "story.wav", tone(3.0, seed=7))
    path = probe.run(audio_cfg(make_cfg, model_dir, f"dataset.root={tmp_path / 'long'}",
                               "layers=[encoder.layers.0]", "dataset.window_seconds=2",
                               "dataset.stride_seconds=1"))
    sound, _ = read_wav(tmp_path / "long" / "a" / "story.wav")
    extractor = AutoFeatureExtractor.from_pretrained(model_dir)
    encoder = WhisperModel.from_pretrained(model_dir).eval().get_encoder()
    with probe.open(path) as f:
        rows = f["encoder.layers.0/output"][:]
        assert f.offsets.tolist() == [0, 150]  # 3 s at 50 frames a second, each once
        np.testing.assert_array_equal(f["positions"][:], np.arange(150))
        # two windows, [0, 2 s) and [1 s, 3 s); a frame is kept from the one where it is more
        # central: frames 0-74 from the first, 75-149 from the second
        for start, low, high in ((0, 0, 75), (50, 25, 100)):
            window = sound[start * 320:start * 320 + 32000]
            features = extractor(window, sampling_rate=16000, return_tensors="pt")
            with torch.no_grad():
                alone = encoder(features.input_features, output_hidden_states=True)
            np.testing.assert_allclose(rows[start + low:start + high],
                                       alone.hidden_states[1][0, low:high].numpy(), atol=2e-5)


def test_an_audio_model_without_frames_is_refused(make_cfg, clips, tmp_path):
    from transformers import ASTConfig, ASTFeatureExtractor, ASTForAudioClassification

    config = ASTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=64, max_length=100, num_mel_bins=32)
    ASTForAudioClassification(config).save_pretrained(tmp_path / "ast")
    ASTFeatureExtractor(num_mel_bins=32, max_length=100).save_pretrained(tmp_path / "ast")
    with pytest.raises(ConfigError, match=r"ASTForAudioClassification does not say how many "
                                          r"frames a clip gives .* AST's patches are not "
                                          r"supported yet") as failed:
        probe.run(make_cfg("model=transformers", f"model.name={tmp_path / 'ast'}",
                           "model.head=audio_classification", "dataset=audio",
                           f"dataset.root={clips}", "layers=[audio_spectrogram_transformer]"))
    assert "\n" not in str(failed.value) and no_h5_files(tmp_path)


def test_a_bfloat16_model_reads_the_float32_features(make_cfg, wav2vec2, clips, tmp_path):
    """Against the same bfloat16 model run by hand on this host, not against float32: on a
    CPU with AMX or AVX512-BF16, oneDNN's bfloat16 kernels put the bare model itself 0.3 off
    its float32 values."""
    half = probe.run(audio_cfg(make_cfg, wav2vec2, f"dataset.root={clips}",
                               "layers=[encoder.layers.0]", "model.dtype=bfloat16",
                               "batch_size=1"))
    files = _files(clips)
    want = _alone(wav2vec2, [read_wav(f)[0] for f in files], dtype=torch.bfloat16)
    with probe.open(half) as f:
        assert f["encoder.layers.0/output"].dtype == np.float32  # output.dtype's default
        for i, rows in enumerate(want):
            got = f["encoder.layers.0/output"][f.offsets[i]:f.offsets[i + 1]]
            np.testing.assert_array_equal(got, rows, err_msg=f"clip {i}")


@pytest.mark.parametrize("how", ["all", "first", "last", "mean"])
def test_positions_of_a_sample_over_several_rows_pool_as_one(how):
    from probe.config.schema import Tokens
    from probe.data.layouts import POSITIONS_FIRST, Pieces

    value = torch.randn(5, 6, 3, generator=torch.Generator().manual_seed(0))
    keep = torch.rand(5, 6, generator=torch.Generator().manual_seed(1)) > 0.3
    keep[:, 0] = True
    row_sample = torch.tensor([0, 0, 1, 2, 2])  # sample 0 and 2 span two rows each
    got = Pieces(keep, piece_sample=row_sample).select("x/output", value, POSITIONS_FIRST,
                                                       Tokens[how])
    per_sample = [torch.cat([value[r][keep[r]] for r in range(5) if row_sample[r] == s])
                  for s in range(3)]
    want = {"all": torch.cat(per_sample), "first": torch.stack([p[0] for p in per_sample]),
            "last": torch.stack([p[-1] for p in per_sample]),
            "mean": torch.stack([p.mean(0) for p in per_sample])}[how]
    torch.testing.assert_close(got, want)


def test_frames_and_clips_know_their_time(make_cfg, wav2vec2, clips):
    path = probe.run(audio_cfg(make_cfg, wav2vec2, f"dataset.root={clips}",
                               "layers=[encoder.layers.0]", "batch_size=3"))
    with probe.open(path) as f:
        rate = f.attrs["frame_rate"]
        np.testing.assert_array_equal(f["onset"][:], f["positions"][:] / rate)
        assert f["onset"].shape == f["positions"].shape  # one per frame row
        lengths = {p.name: len(read_wav(p)[0]) / read_wav(p)[1] for p in _files(clips)}
        np.testing.assert_allclose(
            f["duration"][:], [lengths[name.split("/")[-1]] for name in
                               f["file"][:].astype(str)])
        assert f["onset"].dtype == np.float64 and list(f["duration"].attrs["dims"]) == ["sample"]


def test_whispers_decoder_reads_each_transcript_teacher_forced(make_cfg, clips, tmp_path):
    """An encoder-decoder's decoder, fed each clip's transcript (dataset.transcript_column):
    a row per transcript token, bounded by /decoder_offsets, equal to the model run on each
    clip and its transcript alone; without the column, hooking the decoder is one line."""
    from transformers import AutoFeatureExtractor, AutoTokenizer, WhisperModel
    from transformers.models.whisper.modeling_whisper import shift_tokens_right

    from tests.tiny_audio import ctc_tokenizer

    model_dir = ctc_tokenizer(tiny_whisper(tmp_path / "whisper", seconds=2))
    files = _files(clips)[:3]
    texts = ["abc", "bad cab", "hide"]
    listing = tmp_path / "speech.jsonl"
    listing.write_text("".join(json.dumps({"audio": str(p), "text": t}) + "\n"
                               for p, t in zip(files, texts, strict=True)))
    layers = "encoder.blocks.1,decoder.blocks.0,decoder.blocks.0.cross_attention"
    path = probe.run(audio_cfg(make_cfg, model_dir, f"dataset.path={listing}",
                               "dataset.transcript_column=text", f"layers=[{layers}]",
                               "batch_size=3"))
    extractor = AutoFeatureExtractor.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = WhisperModel.from_pretrained(model_dir).eval()
    seen = {}
    block = model.decoder.layers[0]
    block.register_forward_hook(lambda m, a, out: seen.update(v=out[0] if isinstance(
        out, tuple) else out))
    with probe.open(path) as f:
        ends, read = f["decoder_offsets"][:], f["decoder_input_ids"][:]
        for i, (file, text) in enumerate(zip(files, texts, strict=True)):
            labels = torch.tensor([tokenizer(text_target=text).input_ids])
            shifted = shift_tokens_right(labels, 0, 1)
            assert ends[i + 1] - ends[i] == labels.shape[1]
            np.testing.assert_array_equal(read[ends[i]:ends[i + 1]], shifted[0].numpy())
            inputs = extractor(read_wav(file)[0], sampling_rate=16000, return_tensors="pt")
            with torch.no_grad():
                model(input_features=inputs["input_features"], decoder_input_ids=shifted)
            np.testing.assert_allclose(f.rows_of("decoder.blocks.0/output", row=i),
                                       seen["v"][0].numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ConfigError, match="dataset.transcript_column") as caught:
        probe.run(audio_cfg(make_cfg, model_dir, f"dataset.path={listing}",
                            "layers=[decoder.blocks.0]", output=tmp_path / "none.h5"))
    assert "\n" not in str(caught.value)


def test_whispers_nll_gradients_are_each_transcripts_loss(make_cfg, clips, tmp_path):
    """objective=nll of an encoder-decoder with a language-model head: each clip's transcript
    loss through its decoder, as transformers' own loss of the clip alone differentiates."""
    from transformers import (
        AutoFeatureExtractor,
        AutoTokenizer,
        WhisperConfig,
        WhisperForConditionalGeneration,
    )

    from tests.tiny_audio import ctc_tokenizer

    model_dir = ctc_tokenizer(tiny_whisper(tmp_path / "whisper", seconds=2))
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(WhisperConfig.from_pretrained(model_dir)).eval()
    model.save_pretrained(model_dir)
    files, texts = _files(clips)[:2], ["abc", "hide"]
    listing = tmp_path / "speech.jsonl"
    listing.write_text("".join(json.dumps({"audio": str(p), "text": t}) + "\n"
                               for p, t in zip(files, texts, strict=True)))
    path = probe.run(make_cfg("model=transformers", f"model.name={model_dir}", "dataset=audio",
                              f"dataset.path={listing}", "dataset.transcript_column=text",
                              "layers=[decoder.blocks.0]", "hooks=[backward]", "objective=nll",
                              "batch_size=2"))
    extractor = AutoFeatureExtractor.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with probe.open(path) as f:
        for i, (file, text) in enumerate(zip(files, texts, strict=True)):
            inputs = extractor(read_wav(file)[0], sampling_rate=16000, return_tensors="pt")
            labels = torch.tensor([tokenizer(text_target=text).input_ids])
            want = _layer_grads(model, {**inputs, "labels": labels}, "model.decoder.layers.0",
                                lambda out: out.loss)
            np.testing.assert_allclose(f.rows_of("decoder.blocks.0/grad_output", row=i), want,
                                       rtol=1e-4, atol=1e-6)


def test_whispers_answers_rows_are_its_decoders_teacher_forced(make_cfg, clips, tmp_path):
    """generate.max_new_tokens on an encoder-decoder that reads sound: Whisper's own
    generate(); the decoder's rows of each step equal the model run on the clip with the
    tokens the steps read, teacher-forced."""
    from transformers import AutoFeatureExtractor, WhisperConfig, WhisperForConditionalGeneration

    from tests.tiny_audio import ctc_tokenizer

    model_dir = ctc_tokenizer(tiny_whisper(tmp_path / "whisper", seconds=2))
    torch.manual_seed(1)
    model = WhisperForConditionalGeneration(WhisperConfig.from_pretrained(model_dir)).eval()
    model.save_pretrained(model_dir)
    files = _files(clips)[:3]
    listing = tmp_path / "clips.jsonl"
    listing.write_text("".join(json.dumps({"audio": str(p)}) + "\n" for p in files))
    path = probe.run(make_cfg("model=transformers", f"model.name={model_dir}", "dataset=audio",
                              f"dataset.path={listing}", "layers=[decoder.blocks.0]",
                              "generate.max_new_tokens=3", "generate.stop_at_eos=false",
                              "batch_size=3"))
    extractor = AutoFeatureExtractor.from_pretrained(model_dir)
    seen = {}
    model.model.decoder.layers[0].register_forward_hook(
        lambda m, a, out: seen.update(v=out[0] if isinstance(out, tuple) else out))
    with probe.open(path) as f:
        ends, read = f["decoder_offsets"][:], f["decoder_input_ids"][:]
        assert (np.diff(ends) == 3).all()  # a row per new token
        for i, file in enumerate(files):
            inputs = extractor(read_wav(file)[0], sampling_rate=16000, return_tensors="pt")
            with torch.no_grad():
                logits = model(input_features=inputs["input_features"], decoder_input_ids=(
                    torch.as_tensor(read[ends[i]:ends[i + 1]], dtype=torch.long)[None])).logits
            np.testing.assert_allclose(f.rows_of("decoder.blocks.0/output", row=i),
                                       seen["v"][0].numpy(), rtol=1e-4, atol=1e-5)
            # each token read is the argmax of the step before (greedy)
            assert logits[0, :-1].argmax(-1).tolist() == read[ends[i] + 1:ends[i + 1]].tolist()
