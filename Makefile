# Two commands do all the set-up: `make lab` (the course) and `make test` (the suite).
# The first use of either creates .venv and installs everything; later uses reuse it.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: lab instructor test test-browser test-grading demo bench clean-venv sandbox-tools production

# JupyterLab on loopback only, with the random token Jupyter makes at each start (the URL it prints carries it);
# --allow-root only for root (containers, cloud notebooks), where JupyterLab refuses to start without it.
# JUPYTER_CONFIG_PATH puts jupyter/student (or jupyter/instructor) first on Jupyter's config search path, for
# this process only: the student one turns nbgrader's instructor tools off; both save course notebooks without
# their outputs (specdec_lab/course_files.py), so running the course never dirties the checkout. LAB_ARGS adds
# options (--port=...).
LAB_ARGS ?=
LAB = $(VENV)/bin/jupyter lab --notebook-dir=. --ServerApp.ip=127.0.0.1 --LabApp.default_url=/lab/tree/lessons \
      $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[lab,dev]"
	touch $(STAMP)

lab: $(STAMP)  ## start JupyterLab on the course (lessons/ first), as a student sees it
	JUPYTER_CONFIG_PATH=$(CURDIR)/jupyter/student $(LAB)

instructor: $(STAMP)  ## the same JupyterLab with nbgrader's instructor tools (formgrader, create assignment)
	JUPYTER_CONFIG_PATH=$(CURDIR)/jupyter/instructor $(LAB)

sandbox-tools:  ## the grader's sandbox: bubblewrap (installed with apt-get when missing and we are root)
	@command -v bwrap >/dev/null || { test "$$(id -u)" = 0 && command -v apt-get >/dev/null \
	  && (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null); } \
	  || { echo "the autograder needs bubblewrap (bwrap): apt-get install bubblewrap"; exit 1; }

production: $(STAMP)  ## llama.cpp from PyPI's sources, built once into ~/.cache/specdec-lab (needs cmake, g++)
	$(PY) -m pip install --quiet -e ".[lab,dev,production]"
	$(PY) -m specdec_lab.llamacpp build

test: $(STAMP) sandbox-tools  ## lint, then the whole test suite
	$(VENV)/bin/ruff check .
	$(PY) -m pytest $(PYTEST_ARGS)

test-browser: $(STAMP)  ## the browser suite: JupyterLab in Chromium (installs chromium with apt-get when root)
	@test -x /usr/bin/chromium || { test "$$(id -u)" = 0 && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } || \
	  { echo "make test-browser needs /usr/bin/chromium: apt-get install chromium (as root)"; exit 1; }
	$(PY) -m pytest -m browser $(PYTEST_ARGS)

test-grading: $(STAMP) sandbox-tools  ## the slow end-to-end nbgrader runs over every simulated submission
	$(PY) -m pytest -m grading $(PYTEST_ARGS)

demo: $(STAMP)  ## plain vs speculative decoding on the default models, in the terminal
	$(VENV)/bin/specdec demo

bench: $(STAMP)  ## the side-by-side benchmark on the zoo pair
	$(VENV)/bin/specdec bench

clean-venv:
	rm -rf $(VENV)
