"""``python -m probe``: parse the Hydra config and run the pipeline (see probe.runner.run)."""

from probe.cli import main

if __name__ == "__main__":
    main()
