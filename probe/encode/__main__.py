"""``python -m probe.encode``: ridge encoding models of stored keys (probe.commands.encode)."""

from probe.commands.encode import main

if __name__ == "__main__":
    main()
