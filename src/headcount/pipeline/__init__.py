"""The stage drivers: what each workflow script calls, from file paths to written results."""
