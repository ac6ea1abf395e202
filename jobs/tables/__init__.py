"""Tables of the jobs app beyond jobs/models.py, which imports (and so registers) each."""
