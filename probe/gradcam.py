"""``python -m probe.gradcam``: Grad-CAM maps of a conv layer (probe.commands.gradcam)."""

if __name__ == "__main__":
    from probe.commands.gradcam import main

    main()
