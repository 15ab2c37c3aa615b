"""``python -m probe.fit``: linear probes on a file (probe.commands.fit)."""

if __name__ == "__main__":
    from probe.commands.fit import main

    main()
