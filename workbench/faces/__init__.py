"""What a person uses: the Workbench, the notebook panel and charts, tables, the CLI, exports, the workshop."""
