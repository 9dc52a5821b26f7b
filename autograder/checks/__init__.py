"""The trusted checker: one module per lab maps every test cell's grade id to a Check (probe, inputs, judge).

Only the grading process imports this package; the sandbox never sees it. Students receive the lab notebooks,
whose hidden test cells say only that hidden tests run when the lab is graded.
"""
