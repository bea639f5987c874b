"""The lessons' aids: the Verdict every checker returns, the checkers, the explorers, the interview drill,
the syllabus, the student copies, a learner's workbook and the nbgrader course. Nothing in the core imports this
package."""
