"""The course on JupyterHub: a hub configuration for a class (hub/jupyterhub_config.py), nbgrader's exchange set
up for the course (exchange.py), the instructor's round trip through it (course.py) and the command line that
starts and drives both (python -m hub; see hub/README.md)."""
