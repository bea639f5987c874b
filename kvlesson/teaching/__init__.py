"""The lessons' aids: the Verdict every checker returns, the checkers, the explorers, the interview drill,
the syllabus and the student copies. Nothing in the core imports this package."""
