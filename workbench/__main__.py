"""`python -m workbench ...`: see faces/cli.py."""

import sys

from .faces.cli import main

sys.exit(main())
