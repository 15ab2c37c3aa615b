"""``python -m probe.verify``: a checkpoint's rows, patterns, answers and gradients against the
model computed alone (probe.commands.verify)."""

if __name__ == "__main__":
    from probe.commands.verify import main

    main()
