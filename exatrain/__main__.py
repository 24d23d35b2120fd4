"""`python -m exatrain ...`: the same command as `exatrain ...` (for environments without the console
script)."""

import sys

from exatrain.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
