# Two commands do all the set-up: `make lab` (the course) and `make test` (the suite).
# The first use of either creates .venv and installs everything; later uses reuse it.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: lab test test-grading demo bench clean-venv sandbox-tools

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[lab,dev]"
	touch $(STAMP)

lab: $(STAMP)  ## start JupyterLab on the course (lessons/ first)
	$(VENV)/bin/jupyter lab --notebook-dir=. --ServerApp.default_url=/lab/tree/lessons

sandbox-tools:  ## the grader's sandbox: bubblewrap (installed with apt-get when missing and we are root)
	@command -v bwrap >/dev/null || { test "$$(id -u)" = 0 && command -v apt-get >/dev/null \
	  && (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null); } \
	  || { echo "the autograder needs bubblewrap (bwrap): apt-get install bubblewrap"; exit 1; }

test: $(STAMP) sandbox-tools  ## lint, then the whole test suite
	$(VENV)/bin/ruff check .
	$(PY) -m pytest $(PYTEST_ARGS)

test-grading: $(STAMP) sandbox-tools  ## the slow end-to-end nbgrader runs over every simulated submission
	$(PY) -m pytest -m grading $(PYTEST_ARGS)

demo: $(STAMP)  ## plain vs speculative decoding on the default models, in the terminal
	$(VENV)/bin/specdec demo

bench: $(STAMP)  ## the side-by-side benchmark on the zoo pair
	$(VENV)/bin/specdec bench

clean-venv:
	rm -rf $(VENV)
