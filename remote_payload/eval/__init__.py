"""The `eval` subcommand: settings, the stage pipeline, the offline draft pass and the online loop."""
