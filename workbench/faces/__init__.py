"""What a person uses: the Workbench, the notebook panel and charts, tables, the CLI, exports, the workshop."""

from . import display as display  # registers the HTML of TrialResult and Comparison (core/views.py)
