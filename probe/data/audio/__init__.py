"""Sound, the data kind of speech and audio encoders (model=transformers on wav2vec2, HuBERT,
WavLM, Whisper and other audio checkpoints).

    probe.data.audio.clips     dataset=audio: a folder of class subfolders, or a csv/jsonl list of
                         files; decoded by soundfile, mono, resampled by soxr to the rate of
                         the checkpoint's feature extractor
    probe.data.audio.feed     batches made by the checkpoint's own feature extractor; rows per
                         real frame (AudioFeed)

Needs the `audio` extra (soundfile, soxr) and transformers; other runs never import it.
"""
