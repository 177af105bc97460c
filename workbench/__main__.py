"""`python -m workbench ...`: see cli.py."""

import sys

from .faces.cli import main

sys.exit(main())
