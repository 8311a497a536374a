"""Plain torch references: the oracle for every kernel and the CPU route."""
