"""``python -m probe.fit``: linear probes on a probe file (probe.commands.fit)."""

from probe.commands.fit import main

if __name__ == "__main__":
    main()
