"""``python -m probe.compare``: CKA and RSA between stored keys (probe.commands.compare)."""

if __name__ == "__main__":
    from probe.commands.compare import main

    main()
