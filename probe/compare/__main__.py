"""``python -m probe.compare``: CKA and RSA between stored keys (probe.commands.compare)."""

from probe.commands.compare import main

if __name__ == "__main__":
    main()
