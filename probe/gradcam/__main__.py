"""``python -m probe.gradcam``: Grad-CAM maps of a probe file (probe.commands.gradcam)."""

from probe.commands.gradcam import main

if __name__ == "__main__":
    main()
