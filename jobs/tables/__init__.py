"""Tables of the jobs app beyond jobs/models.py (at its size limit), one module each;
JobsConfig.import_models registers them with the app (jobs/apps.py)."""
