"""Fix safety: planned changes with their originals, the only code that carries them out (the
fixer), the journal written before each change, the root's locks, rollback and persistence."""
