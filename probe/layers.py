"""``python -m probe.layers``: a model's modules, their stored shapes and sizes
(probe.commands.layers)."""

if __name__ == "__main__":
    from probe.commands.layers import main

    main()
