"""What is made of a finished file: each analysis with its config schema beside it.

    probe.analyses.fit       linear probes per stored key
    probe.analyses.gradcam   Grad-CAM maps of a conv layer
    probe.analyses.compare   CKA and RSA between stored keys, of one file or two
    probe.analyses.encode    ridge encoding models of stored keys for given targets
    probe.analyses.stats, .plots, .tables: rows read in blocks, figures, written tables
"""
