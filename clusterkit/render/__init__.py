"""Pure rendering: (resolved recipe, template search path) to the job's files; the shipped templates live in templates/."""
