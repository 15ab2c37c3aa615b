"""``python -m probe``: the pipeline (probe.commands.run)."""

from probe.commands.run import main

if __name__ == "__main__":
    main()
