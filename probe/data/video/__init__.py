"""Video, the data kind of video models (VideoMAE, TimeSformer, ViViT, V-JEPA 2 through
model=transformers; torchvision's r3d_18, mc3_18, r2plus1d_18, s3d, mvit, swin3d).

    probe.data.video.windows   the frame rule: which frames each time window takes
    probe.data.video.decode    PyAV: frame times from the packets; frames decoded once
    probe.data.video.clips     dataset=video: files listed, cut into windows (a sample each)
    probe.data.video.feed      batches of windows; /onset, /duration, /file per window

Needs the `video` extra (PyAV); other runs never import it.
"""
