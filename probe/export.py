"""``python -m probe.export``: a file for the next tool (probe.commands.export)."""

if __name__ == "__main__":
    from probe.commands.export import main

    main()
