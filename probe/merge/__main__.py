"""``python -m probe.merge``: join shard files (probe.commands.merge)."""

from probe.commands.merge import main

if __name__ == "__main__":
    main()
