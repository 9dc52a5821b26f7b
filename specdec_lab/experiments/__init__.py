"""One-off measurement scripts behind figures in the notes (run with `python -m specdec_lab.experiments.NAME`)."""
