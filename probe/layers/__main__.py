"""``python -m probe.layers``: list a model's modules (probe.commands.layers)."""

from probe.commands.layers import main

if __name__ == "__main__":
    main()
