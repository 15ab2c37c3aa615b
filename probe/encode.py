"""``python -m probe.encode``: ridge encoding models of stored keys (probe.commands.encode)."""

if __name__ == "__main__":
    from probe.commands.encode import main

    main()
