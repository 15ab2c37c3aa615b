"""``python -m probe.merge``: join the files of a sharded run into one (probe.commands.merge)."""

if __name__ == "__main__":
    from probe.commands.merge import main

    main()
